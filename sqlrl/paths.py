"""Where things live. Every path the pipeline writes down is relative to the repo root."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SPIDER_REL = "data/raw/spider"  # the Spider release layout, from `dvc pull`
PREPARED_REL = "data/prepared"  # what the prepare stage writes
SPIDER_DIR = REPO_ROOT / SPIDER_REL


def resolve(path: str | Path, root: Path = REPO_ROOT) -> Path:
    """An absolute path for `path`, reading relative paths against the repo root (not the cwd)."""
    p = Path(path)
    return p if p.is_absolute() else root / p


def relative_to_root(path: str | Path, root: Path = REPO_ROOT) -> str:
    """`path` as a POSIX string relative to the repo root, so outputs are machine-independent.
    Symlinks are not followed: a linked data folder keeps its path inside the repo."""
    p = Path(os.path.abspath(path))
    try:
        return p.relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        return p.as_posix()
