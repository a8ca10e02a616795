"""DVC stage `prepare_eval`: the evaluation sets of eval.sets (Spider-DK, Spider-Syn, BIRD dev,
a user's own) -> one JSONL of evaluation rows per set, and counts per set.

A stage of its own, so adding or changing a set reruns only this stage and the evaluations,
never training. The prompts are built from the prepare params, the way training saw them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlrl.benchmarks.sets import prepare_set
from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.jsonio import write_json, write_jsonl
from sqlrl.params import load_params
from stages import stage_main


def arguments(parser) -> None:
    parser.add_argument("--raw", required=True, help="the folder eval.sets' paths are relative to")
    parser.add_argument("--out", required=True, help="folder for one <set>.jsonl per set")
    parser.add_argument("--metrics", required=True)


def main(args) -> int:
    params = load_params(args.params)
    settings = PromptSettings.from_prepare(params.prepare)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.jsonl"):  # a set removed from params leaves no file behind
        if stale.stem not in params.eval.sets:
            stale.unlink()
    metrics = {}
    for name, spec in params.eval.sets.items():
        rows, metrics[name] = prepare_set(
            name, spec, args.raw, settings, params.prepare.max_dev_examples
        )
        write_jsonl(out / f"{name}.jsonl", rows)
        counts = metrics[name]
        print(
            f"prepare_eval: {name} ({spec.format}): {counts['runnable']} to evaluate, "
            f"{counts['skipped_db_absent']} skipped (database absent: "
            f"{', '.join(counts['absent_databases']) or 'none'})"
        )
    write_json(args.metrics, metrics)
    return 0


if __name__ == "__main__":
    sys.exit(stage_main("prepare_eval", main, arguments, __doc__))
