"""DVC stage `prepare`: the Spider release (and prepare.extra_train_sets) -> the prepared
JSONL files and their metrics."""

from __future__ import annotations

import sys

from sqlrl.data.prepare import prepare
from sqlrl.formats import get_format
from sqlrl.jsonio import write_json
from sqlrl.params import load_params
from stages import stage_main


def arguments(parser) -> None:  # paths as strings, exactly as dvc.yaml writes them
    parser.add_argument("--spider", required=True, help="the Spider release")
    parser.add_argument("--extra-train", help="the folder of prepare.extra_train's files")
    parser.add_argument("--raw", help="the folder prepare.extra_train_sets' paths start in")
    parser.add_argument("--out", required=True, help="folder for the JSONL files")
    parser.add_argument("--metrics", required=True)


def main(args) -> int:
    params = load_params(args.params)
    sft_format = get_format(params.grpo.rollout).sft_formatter(params.grpo)  # sft.jsonl's format
    metrics = prepare(
        params.prepare,
        params.seed,
        args.spider,
        args.out,
        args.extra_train,
        args.raw,
        sft_format=sft_format,
    )
    write_json(args.metrics, metrics)
    train, dev = metrics["train"], metrics["dev"]
    print(
        f"prepare: {train['sft']} training examples, {train['heldout']} held out, "
        f"{dev['examples']} dev; skipped (database absent): {train['skipped_db_absent']} "
        f"train {train['absent_databases']}, {dev['skipped_db_absent']} dev "
        f"{dev['absent_databases']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(stage_main("prepare", main, arguments, __doc__))
