"""Benchmark exact match (EM) scoring: every Spider dev gold query against a reordered copy.

    python benchmarks/bench_spider_eval.py

Evaluation scores EM on every prediction; this times the parse + compare of all 1034 dev
pairs from a cold parse cache (a few seconds on a 2-core CPU when this was written).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.eval.spider_eval import exact_match  # noqa: E402
from sqlrl.eval.spider_eval import parse as parse_module  # noqa: E402


def main() -> None:
    spider = ROOT / "data" / "raw" / "spider"
    dev = json.loads((spider / "dev.json").read_text())
    schemas = {t["db_id"]: t for t in json.loads((spider / "tables.json").read_text())}
    parse_module._parse_cached.cache_clear()
    start = time.perf_counter()
    matched = sum(
        bool(exact_match(ex["query"], ex["query"].lower(), schemas[ex["db_id"]])) for ex in dev
    )
    elapsed = time.perf_counter() - start
    print(f"{len(dev)} gold/prediction pairs scored in {elapsed:.2f} s ({matched} exact matches)")


if __name__ == "__main__":
    main()
