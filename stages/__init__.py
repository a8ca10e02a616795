"""Thin DVC entry points: `python -m stages.<name> --flag PATH ...` reads params, calls sqlrl,
writes outputs. dvc.yaml names every file a stage reads or writes and passes it in the stage's
cmd; sqlrl itself holds no paths.

Every stage runs through `stage_main`: its arguments parsed, the library's logging shown, one
process at a time per stage and workspace, and the input errors the pipeline knows ending as
one line naming their cause and exit code 1."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

# before any stage imports the hub libraries, which read them at import
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

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


def parse_stage_args(
    name: str,
    arguments: Callable[[argparse.ArgumentParser], None],
    description: str | None = None,
    argv: list[str] | None = None,
) -> argparse.Namespace:
    """The stage's command line: `--params` (params.yaml) and what `arguments(parser)` adds."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{name}", description=description)
    parser.add_argument("--params", default="params.yaml", help="what DVC composed from conf/")
    arguments(parser)
    return parser.parse_args(argv)


def show_logs() -> None:
    """sqlrl's log lines on stderr; other libraries' warnings only."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("sqlrl").setLevel(logging.INFO)


def stage_main(
    name: str,
    main: Callable[[argparse.Namespace], int],
    arguments: Callable[[argparse.ArgumentParser], None],
    description: str | None = None,
    argv: list[str] | None = None,
    lock: Callable[[argparse.Namespace], str] | None = None,
) -> int:
    """`python -m stages.<name>`: `arguments(parser)` declares the paths dvc.yaml passes, then
    main(args) runs under the stage's lock (`lock(args)` names it for a stage that runs once
    per model)."""
    args = parse_stage_args(name, arguments, description, argv)
    show_logs()
    return run_stage(lock(args) if lock else name, main, args)
