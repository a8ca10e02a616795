"""Training processes: sft and grpo run in this process, or under `accelerate launch` with the
`launch` params (data parallel over GPUs; over CPU processes with gloo where there is no GPU).

One process runs in-process, as before this existed: no launcher start-up, no change in what
is computed. Under the launcher every rank runs the stage; `is_main_process` says which one
deletes, writes and renames outputs (the others wait for it at `wait_for_everyone`).
"""

from __future__ import annotations

import os
import sys

from sqlrl.errors import PipelineError
from sqlrl.params import LaunchParams


def world_size() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def is_main_process() -> bool:
    """Rank 0, or the only process: the one that writes outputs."""
    return os.environ.get("RANK", "0") == "0"


def wait_for_everyone() -> None:
    """A barrier across the ranks (nothing to wait for in one process)."""
    if world_size() > 1:
        import torch
        from accelerate import PartialState

        # the state the Trainer will share: without cpu=True a CPU rank would see one process
        PartialState(cpu=not torch.cuda.is_available()).wait_for_everyone()


def check_one_process_per_gpu() -> None:
    """Refuse a lone training process that sees several GPUs, before any model is loaded.

    With several GPUs and no distributed launch, transformers' Trainer wraps the model in
    nn.DataParallel over all of them: each SFT step takes that many times the rows its metrics
    report, and TRL's GRPOTrainer then refuses to start, hours later. It refuses rather than
    pins the process to one GPU: CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises,
    and `torch.cuda.is_available()` (stages.launch, accelerate) has done that before a stage
    runs; and a machine's other GPUs left idle without a word is rarely what was meant.
    """
    if world_size() > 1:
        return
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus > 1:
        raise PipelineError(
            f"{gpus} GPUs are visible to one training process: transformers would spread it "
            f"over them with nn.DataParallel ({gpus}x the rows per step that the metrics say) "
            f"and TRL refuses GRPO under it. Set launch.num_processes to {gpus} (one process "
            f"per GPU: dvc exp run -S launch.num_processes={gpus}), or make one GPU visible "
            f"(CUDA_VISIBLE_DEVICES=0)"
        )


def accelerate_command(params: LaunchParams, module: str, cuda: bool) -> list[str] | None:
    """The `accelerate launch` command line that runs `python -m module` in
    params.num_processes processes, or None to run it in this process."""
    if params.num_processes == 1 and not params.config:
        return None
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if params.config:
        cmd += ["--config_file", params.config]
    else:  # no config: plain data parallel, without accelerate's warnings about defaults
        cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        if params.num_processes > 1:
            cmd += ["--multi_gpu"]  # torchrun; a CPU rank joins gloo (use_cpu in the configs)
    cmd += ["--num_processes", str(params.num_processes)]
    if not cuda:  # the ranks share the cores (sqlrl.hardware sizes torch threads the same way)
        from sqlrl.hardware import cores_per_process

        threads = cores_per_process(params.num_processes)
        cmd += ["--num_cpu_threads_per_process", str(threads)]
    return [*cmd, "-m", module]
