"""DVC stage `merge`: models/sft + models/grpo_adapter -> models/final (plain safetensors)."""

from __future__ import annotations

import sys

from sqlrl.train.merge import merge_adapter
from stages import run_stage


def main() -> int:
    try:
        info = merge_adapter("models/sft", "models/grpo_adapter", "models/final")
    except FileNotFoundError as exc:
        print(f"merge: {exc}", file=sys.stderr)
        return 1
    print(f"merge: models/final written ({info['parameters']:,} parameters, {info['dtype']})")
    return 0


if __name__ == "__main__":
    sys.exit(run_stage("merge", main))
