"""DVC stage `base`: the starting model and its metrics.

Hub profile: resolve the pinned model in transformers' hub cache, record it in the metrics.
CPU profile: train a tokenizer on the SFT data and build a Qwen2 model from params.
"""

from __future__ import annotations

import sys
import time

from sqlrl.jsonio import write_json
from sqlrl.model.modeling import build_base
from sqlrl.params import load_params
from stages import stage_main


def arguments(parser) -> None:
    parser.add_argument("--sft-data", required=True, help="trains the tokenizer")
    parser.add_argument("--out", required=True, help="the model folder")
    parser.add_argument("--metrics", required=True)


def main(args) -> int:
    start = time.perf_counter()
    params = load_params(args.params)
    record = build_base(params.base, params.seed, args.sft_data, args.out)
    metrics = {**record, "wall_seconds": round(time.perf_counter() - start, 1)}
    write_json(args.metrics, metrics)
    print(f"base: {record['source']} model, {record['n_params']:,} parameters -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(stage_main("base", main, arguments, __doc__))
