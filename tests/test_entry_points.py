"""Every command a user runs answers --help with its usage, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.repo_tools import REPO_ROOT

STAGES = sorted(p.stem for p in (REPO_ROOT / "stages").glob("*.py") if p.stem != "__init__")
COMMANDS = [
    ["-m", "sqlrl.params"],
    ["-m", "sqlrl.eval.score"],
    ["-m", "sqlrl.eval.report"],
    ["-m", "sqlrl.serve"],
    ["scripts/gpu_rehearsal.py"],
    *(["-m", f"stages.{name}"] for name in STAGES),
]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[-1] for c in COMMANDS])
def test_help_prints_the_usage(command):
    done = subprocess.run(
        [sys.executable, *command, "--help"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "Traceback" not in done.stderr
