"""DVC stage `sft`: the base model + the SFT rows -> the fine-tuned model, its metrics and the
training curves (DVCLive)."""

from __future__ import annotations

import sys

from sqlrl.data.prompt_settings import write_prompt_settings
from sqlrl.jsonio import write_json
from sqlrl.params import load_params
from sqlrl.train.launch import check_one_process_per_gpu, is_main_process
from sqlrl.train.sft import train_sft
from stages import stage_main


def arguments(parser) -> None:
    parser.add_argument("--base", required=True, help="the starting model folder")
    parser.add_argument("--data", required=True, help="sft.jsonl")
    parser.add_argument("--out", required=True, help="the model folder")
    parser.add_argument("--checkpoints", required=True, help="outside DVC's outputs: sft.resume")
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--dvclive", required=True, help="the training curves")


def main(args) -> int:
    params = load_params(args.params)
    check_one_process_per_gpu()
    metrics = train_sft(
        params.sft,
        params.seed,
        args.base,
        args.data,
        args.out,
        args.dvclive,
        checkpoint_dir=args.checkpoints,
        torch_threads=params.torch_threads,
    )
    if not is_main_process():  # rank 0 writes the model folder and the metrics
        return 0
    # the prompts and the answer format this model was trained on (the rows prepare wrote in
    # grpo.rollout's format), for evaluation and the server (never the workspace's params)
    write_prompt_settings(args.out, params.prepare, params.eval.schema_repair, params.grpo)
    write_json(args.metrics, metrics)
    print(_summary(metrics, args.out))
    return 0


def _summary(metrics: dict, out) -> str:
    """The stage's last line. The loss is shown to 4 digits: the trainer logs a float32, which
    prints raw as 1.0296833038330078 (the times and rates are rounded when measured)."""
    return (
        f"sft: {metrics['rows_trained']} of {metrics['examples']} rows trained (none cut), "
        f"{metrics['steps']} steps, final loss {_number(metrics['final_loss'])}, "
        f"{metrics['wall_seconds']} s, {metrics['tokens_per_second']} tokens/s "
        f"({'bf16' if metrics['bf16'] else 'fp32'}: {metrics['bf16_reason']}) -> {out}"
    )


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


if __name__ == "__main__":
    sys.exit(stage_main("sft", main, arguments, __doc__))
