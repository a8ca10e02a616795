"""DVC stage `evaluate@<name>`: a model on the dev (and held-out) split and on each set of
eval.sets (prepare_eval's rows, each scored by its benchmark's rules) -> its metrics and
prediction files. Greedy always; maj@eval.num_samples too for the models in eval.vote_models.

With --baseline NAME DEV HELDOUT (another model's prediction files), the metrics also get
`vs_<NAME>`: the paired bootstrap 95% interval of the EX difference against it, per split;
--baseline-sets DIR (its <set>.jsonl files) adds each evaluation set to that comparison.
--constrained decodes under each database's grammar whatever eval.constrained says: the stage
`evaluate@final_constrained` puts the final model's constrained EX beside its unconstrained EX,
paired, on every set (docs/grammar.md). A model whose answer format the grammar does not cover
gets metrics that say so, and empty prediction files: the pipeline goes on.
--headline gets the few numbers DVC's default views show (sqlrl.eval.evaluate.headline).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer is used before forks

from sqlrl.benchmarks import get_benchmark  # noqa: E402
from sqlrl.eval.compare import compare_predictions  # noqa: E402
from sqlrl.eval.evaluate import (  # noqa: E402
    ConstrainedFormatError,
    Split,
    evaluate_model,
    headline,
    spider_splits,
)
from sqlrl.hardware import set_torch_threads  # noqa: E402
from sqlrl.jsonio import read_jsonl, write_json, write_jsonl  # noqa: E402
from sqlrl.params import load_params  # noqa: E402
from stages import stage_main  # noqa: E402


def arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="the model folder")
    parser.add_argument("--dev", required=True, help="dev.jsonl")
    parser.add_argument("--heldout", required=True, help="heldout.jsonl (may be empty)")
    parser.add_argument("--spider", required=True, help="the Spider release")
    parser.add_argument("--sets", required=True, help="prepare_eval's <set>.jsonl folder")
    parser.add_argument("--raw", required=True, help="the folder eval.sets' paths are relative to")
    parser.add_argument("--predictions", required=True, help="dev predictions (JSONL)")
    parser.add_argument("--heldout-predictions", required=True)
    parser.add_argument("--set-predictions", required=True, help="folder: <set>.jsonl per set")
    parser.add_argument("--metrics", required=True, help="every metric (JSON)")
    parser.add_argument("--headline", required=True, help="the few that DVC's views show (JSON)")
    parser.add_argument(
        "--baseline",
        nargs=3,
        metavar=("NAME", "DEV", "HELDOUT"),
        help="compare with this model's prediction files",
    )
    parser.add_argument(
        "--baseline-sets", metavar="DIR", help="the baseline's <set>.jsonl files: compare them too"
    )
    parser.add_argument(
        "--constrained",
        action="store_true",
        help="decode under each database's grammar (eval.constrained) whatever params say",
    )


def main(args) -> int:
    name = Path(args.model).name
    if not Path(args.model).is_dir():
        print(
            f"evaluate: {args.model} does not exist (run `dvc repro {name}` first)", file=sys.stderr
        )
        return 1
    params = load_params(args.params)
    settings = replace(params.eval, constrained=True) if args.constrained else params.eval
    set_torch_threads(params.torch_threads)
    splits = spider_splits(args.dev, args.heldout, args.spider)
    try:
        splits.update(_benchmark_sets(params.eval.sets, args.sets, args.raw))
        metrics, predictions = evaluate_model(
            args.model, settings, params.seed, splits, vote=name in params.eval.vote_models
        )
    except FileNotFoundError as exc:  # the others are PipelineErrors: run_stage reports them
        print(f"evaluate: {exc}", file=sys.stderr)
        return 1
    except ConstrainedFormatError as exc:
        if not args.constrained:
            raise
        # eval.constrained itself refuses such a model; this stage runs in every profile
        print(f"evaluate: {exc}; writing no predictions", file=sys.stderr)
        metrics, predictions = {"constrained_unavailable": str(exc)}, {"dev": []}
        args.baseline = None
    if args.baseline:
        baseline, *files = args.baseline
        baseline_files = dict(zip(("dev", "heldout"), files, strict=True))
        if args.baseline_sets:
            for split in params.eval.sets:
                baseline_files[split] = str(Path(args.baseline_sets) / f"{split}.jsonl")
        try:
            metrics[f"vs_{baseline}"] = _compare(baseline_files, predictions, params.seed)
        except (FileNotFoundError, ValueError) as exc:
            print(f"evaluate: comparison with {baseline}: {exc}", file=sys.stderr)
            return 1
    write_jsonl(args.predictions, predictions["dev"])
    write_jsonl(args.heldout_predictions, predictions.get("heldout", []))
    _write_set_predictions(args.set_predictions, params.eval.sets, predictions)
    write_json(args.metrics, metrics)
    write_json(args.headline, headline(metrics, args.baseline[0] if args.baseline else None))
    if "dev" in metrics:
        print(_summary(name, metrics))
    return 0


def _benchmark_sets(sets: dict, rows_dir: str, raw_dir: str) -> dict[str, Split]:
    """Each eval.sets entry: prepare_eval's rows, its tables file, its benchmark family (the
    name params give, looked up here once)."""
    splits = {}
    for name, spec in sets.items():
        rows = Path(rows_dir) / f"{name}.jsonl"
        if not rows.is_file():
            raise FileNotFoundError(f"{rows} is missing (run `dvc repro prepare_eval`)")
        benchmark = get_benchmark(spec.format)
        splits[name] = Split(rows, Path(raw_dir) / spec.tables, benchmark, required=True)
    return splits


def _write_set_predictions(folder: str, sets: dict, predictions: dict) -> None:
    """One JSONL per set, and no file of a set that is no longer evaluated."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.jsonl"):
        if stale.stem not in sets:
            stale.unlink()
    for name in sets:
        write_jsonl(folder / f"{name}.jsonl", predictions.get(name, []))


def _compare(baseline_files: dict, predictions: dict, seed: int) -> dict:
    """Paired bootstrap of EX against the baseline's prediction files, per split."""
    out = {}
    for split, path in baseline_files.items():
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path} is missing (run the baseline's evaluate stage)")
        if predictions.get(split):
            out[split] = compare_predictions(read_jsonl(path), predictions[split], seed)
    return out


def _summary(name: str, metrics: dict) -> str:
    dev = metrics["dev"]
    line = (
        f"evaluate@{name}: dev EX {_pct(dev['ex'])} (non-trivial gold "
        f"{_pct(dev['ex_nontrivial'])}) EM {_pct(dev['em'])} "
        f"on {dev['n']} ({dev['skipped']} skipped; EX with skipped as wrong "
        f"{_pct(dev['ex_all'])} of {dev['n'] + dev['skipped']}), "
        f"{dev['examples_per_second']} examples/s{_names(dev)}"
    )
    if "heldout" in metrics:
        held = metrics["heldout"]
        line += (
            f"; held-out EX {_pct(held['ex'])} (non-trivial gold "
            f"{_pct(held['ex_nontrivial'])}) EM {_pct(held['em'])} on {held['n']}"
        )
    for name, split in metrics.items():
        # an evaluation set's metrics (the decoding settings also hold an "n": vLLM's)
        if name not in ("dev", "heldout") and isinstance(split, dict) and "ex" in split:
            maj = f", maj@{split['maj']['k']} {_pct(split['maj']['ex'])}" if "maj" in split else ""
            line += f"; {name} EX {_pct(split['ex'])}{maj} on {split['n']}"
            line += f" ({split['skipped']} skipped){_names(split)}"
    return line


def _names(split: dict) -> str:
    """The split's answers naming a table or column their database lacks and, with
    eval.constrained, how its questions decoded (docs/grammar.md)."""
    if split.get("absent_identifier_share") is None:
        return ""
    note = f", absent names {_pct(split['absent_identifier_share'])}"
    grammar = split.get("constrained")
    if grammar:
        dead = "" if grammar["dead_ends"] is None else f", {grammar['dead_ends']} dead ends"
        note += (
            f" [constrained {grammar['grammar_rows']}, fallback {grammar['fallback_rows']}, "
            f"unfinished {grammar['unfinished']}{dead}, compile {grammar['compile_seconds']}s]"
        )
    return note


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


if __name__ == "__main__":
    sys.exit(
        stage_main(
            "evaluate", main, arguments, __doc__, lock=lambda a: f"evaluate-{Path(a.metrics).stem}"
        )
    )
