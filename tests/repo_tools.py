"""Helpers for tests that drive git and DVC in a temporary copy of the repo."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlrl.paths import REPO_ROOT

SMOKE_TARGET = "evaluate@sft"  # how far the end-to-end smoke run goes


def run_cli(args: list[str], cwd: Path, env: dict | None = None) -> str:
    """Run a command (dvc, git) with the venv on PATH; a failure shows its output."""
    env = {**os.environ, **(env or {}), "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def storage_url() -> str:
    """The shared remote as an absolute path (its URL in .dvc/config is relative to .dvc/)."""
    out = subprocess.run(["git", "config", "-f", ".dvc/config", 'remote.storage.url'],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    return str((REPO_ROOT / ".dvc" / out.strip()).resolve())
