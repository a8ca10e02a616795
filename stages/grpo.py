"""DVC stage `grpo`: the SFT model + the selected prompts -> the LoRA adapter, its metrics and
the reward/loss curves (DVCLive)."""

from __future__ import annotations

import sys

from sqlrl.jsonio import read_jsonl, write_json
from sqlrl.params import load_params
from sqlrl.train.grpo import train_grpo
from sqlrl.train.grpo_prompts import ROW_KEYS
from sqlrl.train.launch import check_one_process_per_gpu, is_main_process
from sqlrl.train.rewards import reward_functions
from stages import stage_main


def arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="the SFT model folder")
    parser.add_argument("--prompts", required=True, help="grpo_prompts.jsonl")
    parser.add_argument("--spider", required=True, help="the Spider release")
    parser.add_argument("--out", required=True, help="the adapter folder")
    parser.add_argument("--checkpoints", required=True, help="outside DVC's outputs: grpo.resume")
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--dvclive", required=True, help="the training curves")


def main(args) -> int:
    params = load_params(args.params)
    check_one_process_per_gpu()
    rows = read_jsonl(args.prompts, ROW_KEYS)
    metrics = train_grpo(
        params.grpo,
        params.grpo.seed,
        args.model,
        rows,
        args.out,
        reward_functions(params.grpo, args.spider),
        args.checkpoints,
        args.dvclive,
        torch_threads=params.torch_threads,
        spider_dir=args.spider,
    )
    metrics["train_prompts"] = len(rows)  # what each filter dropped: metrics/grpo_prompts.json
    # the seeds behind this adapter: `seed` made the data, the SFT model and the prompt
    # selection; grpo.seed this run (sqlrl.eval.seeds reads them per run)
    metrics["seeds"] = {"pipeline": params.seed, "grpo": params.grpo.seed}
    if is_main_process():
        write_json(args.metrics, metrics)
    return 0


if __name__ == "__main__":
    sys.exit(stage_main("grpo", main, arguments, __doc__))
