"""Helpers for tests that drive git and DVC in a temporary copy of the repo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SPIDER_DIR = REPO_ROOT / "data" / "raw" / "spider"  # from `dvc pull`


def run_cli(args: list[str], cwd: Path, env: dict | None = None) -> str:
    """Run a command (dvc, git) with the venv on PATH; a failure shows its output."""
    env = {
        **os.environ,
        **(env or {}),
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout + proc.stderr


def storage_url() -> str:
    """The shared remote as an absolute path (DVC resolves its URL relative to .dvc/)."""
    from dvc.repo import Repo

    with Repo(str(REPO_ROOT)) as repo:
        return repo.config["remote"]["storage"]["url"]
