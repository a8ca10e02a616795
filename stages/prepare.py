"""DVC stage `prepare`: Spider release -> data/prepared/*.jsonl and metrics/prepare.json."""

from __future__ import annotations

import sys

from sqlrl.data.prepare import prepare
from sqlrl.jsonio import write_json
from sqlrl.params import load_params
from stages import run_stage


def main() -> int:
    params = load_params()
    metrics = prepare(params.prepare, params.seed)
    write_json("metrics/prepare.json", metrics)
    train, dev = metrics["train"], metrics["dev"]
    print(
        f"prepare: {train['sft']} training examples, {train['heldout']} held out, "
        f"{dev['examples']} dev; skipped (database absent): {train['skipped_db_absent']} "
        f"train {train['absent_databases']}, {dev['skipped_db_absent']} dev "
        f"{dev['absent_databases']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_stage("prepare", main))
