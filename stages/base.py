"""DVC stage `base`: the starting model -> models/base and metrics/base.json.

Hub profile: resolve the pinned model in transformers' hub cache, record it in base.json.
CPU profile: train a tokenizer on data/prepared/sft.jsonl and build a Qwen2 model from params.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("DVC_NO_ANALYTICS", "1")

from sqlrl.jsonio import write_json  # noqa: E402
from sqlrl.model.modeling import build_base  # noqa: E402
from sqlrl.params import load_params  # noqa: E402
from stages import run_stage  # noqa: E402

SFT_DATA = "data/prepared/sft.jsonl"
OUT_DIR = "models/base"


def main() -> int:
    start = time.perf_counter()
    params = load_params()
    record = build_base(params.base, params.seed, SFT_DATA, OUT_DIR)
    metrics = {**record, "wall_seconds": round(time.perf_counter() - start, 1)}
    write_json("metrics/base.json", metrics)
    print(f"base: {record['source']} model, {record['n_params']:,} parameters -> {OUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(run_stage("base", main))
