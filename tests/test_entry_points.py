"""Every command a user runs answers --help with its usage, not a traceback, and the usage
names the command as it is typed (`python -m sqlrl.eval.report`, not `report.py`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.repo_tools import REPO_ROOT

STAGES = sorted(p.stem for p in (REPO_ROOT / "stages").glob("*.py") if p.stem != "__init__")
COMMANDS = [
    ["-m", "sqlrl.params"],
    ["-m", "sqlrl.eval.score"],
    ["-m", "sqlrl.eval.report"],
    ["-m", "sqlrl.eval.compare"],
    ["-m", "sqlrl.eval.seeds"],
    ["-m", "sqlrl.serve"],
    ["-m", "sqlrl.feedback"],
    ["-m", "sqlrl.live.copy_to_postgres"],
    ["scripts/gpu_rehearsal.py"],
    *(["-m", f"stages.{name}"] for name in STAGES),
]


def _runnable_modules() -> set[str]:
    """Every module of sqlrl/ and stages/ that runs as `python -m`: a package's __main__.py,
    or a module with an `if __name__ == "__main__":` block."""
    found = set()
    for package in ("sqlrl", "stages"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                found.add(".".join(parts[:-1]))
            elif 'if __name__ == "__main__":' in path.read_text(encoding="utf-8"):
                found.add(".".join(parts))
    return found


def test_every_runnable_module_is_checked():
    assert _runnable_modules() <= {c[1] for c in COMMANDS if c[0] == "-m"}


@pytest.mark.parametrize("command", COMMANDS, ids=[c[-1] for c in COMMANDS])
def test_help_prints_the_usage(command):
    done = subprocess.run(
        [sys.executable, *command, "--help"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "Traceback" not in done.stderr
    if command[0] == "-m":  # argparse would name the file: `usage: report.py`
        assert done.stdout.split()[:4] == ["usage:", "python", "-m", command[1]], done.stdout


def test_the_package_imports_from_any_folder(tmp_path):
    """The README's set-up installs sqlrl itself (requirements.txt's `-e .`), so its Python
    example runs from any folder, not only from the repo root."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", "from sqlrl.text_to_sql import TextToSQL"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, "pip install -e . (requirements.txt's last line)\n" + done.stderr
