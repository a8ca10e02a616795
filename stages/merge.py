"""DVC stage `merge`: the SFT model + the GRPO adapter -> one plain safetensors model."""

from __future__ import annotations

import sys

from sqlrl.train.merge import merge_adapter
from stages import stage_main


def arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="the SFT model folder")
    parser.add_argument("--adapter", required=True, help="the GRPO adapter folder")
    parser.add_argument("--out", required=True, help="the merged model folder")


def main(args) -> int:
    try:
        info = merge_adapter(args.model, args.adapter, args.out)
    except FileNotFoundError as exc:
        print(f"merge: {exc}", file=sys.stderr)
        return 1
    print(f"merge: {args.out} written ({info['parameters']:,} parameters, {info['dtype']})")
    return 0


if __name__ == "__main__":
    sys.exit(stage_main("merge", main, arguments, __doc__))
