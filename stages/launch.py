"""`python -m stages.launch stages.sft ARGS...`: a training stage in this process, or under
`accelerate launch` in `launch.num_processes` processes (sqlrl/train/launch.py). The stage lock
is held here, once, for all the processes."""

from __future__ import annotations

import importlib
import subprocess
import sys

from sqlrl.params import load_params
from sqlrl.train.launch import accelerate_command
from stages import parse_stage_args, run_stage, show_logs

TRAINING_STAGES = ("stages.sft", "stages.grpo")


def main(module: str, argv: list[str]) -> int:
    import torch

    stage = importlib.import_module(module)
    name = module.split(".")[-1]
    args = parse_stage_args(name, stage.arguments, stage.__doc__, argv)  # bad flags fail here
    command = accelerate_command(load_params(args.params).launch, module, torch.cuda.is_available())
    if command is None:
        show_logs()
        return stage.main(args)
    print("launch: " + " ".join(command[2:] + argv), flush=True)
    return subprocess.call(command + argv)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TRAINING_STAGES:
        asked = sys.argv[1:2] in (["-h"], ["--help"])
        print(
            f"usage: python -m stages.launch {{{','.join(TRAINING_STAGES)}}} ARGS...\n"
            f"(python -m {TRAINING_STAGES[0]} --help lists a stage's ARGS)",
            file=sys.stdout if asked else sys.stderr,
        )
        sys.exit(0 if asked else 2)
    sys.exit(run_stage(sys.argv[1].split(".")[-1], main, sys.argv[1], sys.argv[2:]))
