"""`python -m stages.launch stages.sft`: a training stage in this process, or under
`accelerate launch` in `launch.num_processes` processes (sqlrl/train/launch.py). The stage lock is
held here, once, for all the processes."""

from __future__ import annotations

import importlib
import subprocess
import sys

from sqlrl.params import load_params
from sqlrl.train.launch import accelerate_command
from stages import run_stage

TRAINING_STAGES = ("stages.sft", "stages.grpo")


def main(module: str) -> int:
    import torch

    command = accelerate_command(load_params().launch, module, torch.cuda.is_available())
    if command is None:
        return importlib.import_module(module).main()
    print("launch: " + " ".join(command[2:]), flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in TRAINING_STAGES:
        print(f"usage: python -m stages.launch {{{','.join(TRAINING_STAGES)}}}", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_stage(sys.argv[1].split(".")[-1], main, sys.argv[1]))
