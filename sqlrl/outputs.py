"""Every model folder a stage writes (base, sft, grpo adapter, final) is written here.

The folder is written complete under a temporary sibling name and then renamed into place, so
a run killed mid-save never leaves an output that looks finished (DVC would cache it, and the
next stage would load half a model).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path


def _no_barrier() -> None:
    """One process: nothing to wait for."""


def save_atomically(
    out_dir: str | Path,
    save: Callable[[Path], None],
    writer: bool = True,
    barrier: Callable[[], None] = _no_barrier,
) -> None:
    """Run save(tmp) into a temporary sibling of out_dir, then replace out_dir with it. Every
    process calls save (a sharded model needs all of them); only the writer deletes and
    renames, between barriers so no process reads a half-written folder."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if writer:
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    save(tmp)
    if writer:
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    barrier()
