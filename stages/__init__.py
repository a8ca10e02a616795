"""Thin DVC entry points: `python -m stages.<name>` reads params, calls sqlrl, writes outputs.

Every stage runs through `run_stage`: one process at a time per stage and workspace, and the
input errors the pipeline knows end as one line naming their cause and exit code 1."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

LOCK_DIR = Path(".dvc/tmp/stage-locks")  # git-ignored; in the workspace DVC runs the stage in


class StageBusyError(RuntimeError):
    """Another process is running this stage on the same outputs."""


def stage_lock(name: str, lock_dir: Path = LOCK_DIR):
    """An exclusive lock for stage `name`, held while the returned file stays open. Killing
    `dvc repro` can leave its stage running; a second run on the same checkpoints, models and
    metrics would corrupt them, so it fails at once, naming the running process."""
    import fcntl

    lock_dir.mkdir(parents=True, exist_ok=True)
    handle = open(lock_dir / f"{name}.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise StageBusyError(
            f"another process (pid {holder}) is running this stage on the same outputs; "
            f"wait for it or stop it (kill {holder}), then run again"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def run_stage(name: str, main: Callable[..., int], *args) -> int:
    """main(*args) under the stage's lock; a known error is printed as `name: message`."""
    from contextlib import nullcontext

    from sqlrl.errors import PipelineError

    launched = "LOCAL_RANK" in os.environ  # a rank under accelerate launch / torchrun
    try:  # stages.launch holds the lock for all the ranks it started
        with nullcontext() if launched else stage_lock(name):
            return main(*args)
    except (StageBusyError, PipelineError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
