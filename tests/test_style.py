"""The tree stays lint- and format-clean under the settings in pyproject.toml (ruff), so a
change that breaks the shared style fails here and not in review."""

from __future__ import annotations

import subprocess
import sys

from tests.repo_tools import REPO_ROOT


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ruff_finds_nothing_to_fix():
    result = _ruff("check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


def test_ruff_format_would_change_nothing():
    result = _ruff("format", "--no-cache", "--check", ".")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
