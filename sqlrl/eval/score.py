"""Score predictions against Spider gold: execution accuracy, exact match, hardness, verdicts.

A drop-in for the official evaluator's interface, and a reader of the pipeline's own
predictions:

    python -m sqlrl.eval.score --gold dev_gold.sql --pred pred.sql --db database/ \\
        --table tables.json --out report.json
    python -m sqlrl.eval.score --pred data/predictions/final.jsonl --spider data/raw/spider
    python -m sqlrl.eval.score --bird data/raw/bird-dev --pred predict_dev.json
    python -m sqlrl.eval.score --pred data/predictions/final_sets/bird_dev.jsonl \\
        --bird data/raw/bird-dev

GOLD holds `SQL<TAB>db_id` per line, PRED one SQL per line (same count); or PRED is a JSONL
file of rows holding `gold`, `db_id` and `pred` (the evaluate stage's data/predictions/*.jsonl;
a null `pred`, no SQL found, scores as an empty prediction), and needs no GOLD. EX uses the shared
executor and equality (sqlrl.sql.equality); EM and hardness come from sqlrl.eval.spider_eval.
An item whose database file is absent is "skipped": ex and em are null, and it is left out of
`n` and of the EX/EM fractions, but counted in `skipped`; `ex_all` is EX over every item with the
skipped ones counted as wrong (correct / (n + skipped)), the denominator published Spider
numbers use (all 1,034 dev questions), also per hardness. `ex_nontrivial` is EX without the
questions whose gold result is empty or only 0/NULL (`n_trivial_gold`), which a wrong query
matches easily. The same report comes from `score_predictions` for in-process callers.

BIRD (--bird DIR, a BIRD release: dev_databases/, dev_tables.json, dev_gold.sql, dev.json) is
scored by BIRD's own rule, as its evaluation_ex.py does: the predicted and gold results
compared as sets of rows, EX per difficulty (simple / moderate / challenging), no EM; next to
it BIRD mini_dev's Soft-F1 (`soft_f1`: partial credit per row, see
sqlrl.benchmarks.bird.bird_soft_f1; a query that fails scores 0), averaged over the questions,
overall and per difficulty. PRED is BIRD's predict_dev.json ({"0": "SQL\t----- bird -----\tdb_id",
...}), one SQL a line, or the pipeline's predictions JSONL (a row whose `format` names BIRD
selects BIRD's rule itself).

Each rule is a benchmark family's (sqlrl.benchmarks): its report items, levels and printed
lines; every registered family with a release layout gets its --<name> DIR option. Here the
name on the command line or in the rows is looked up once; the object goes on from there.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sqlrl.benchmarks import BENCHMARKS, Benchmark
from sqlrl.benchmarks.spider import SPIDER
from sqlrl.progress import Progress
from sqlrl.sql.executor import ExecLimits
from sqlrl.sql.judge import JudgePool

EVAL_TIMEOUT_S = 10.0  # per query; rewards use 5 s, evaluation can afford more
_pools: dict[tuple, JudgePool] = {}


class ScoreInputError(ValueError):
    """The gold or prediction file cannot be scored as given; the message says why."""


def score_predictions(
    gold: list[tuple[str, str]],
    preds: list[str],
    db_dir,
    tables_json,
    workers: int | None = None,
    limits: ExecLimits | None = None,
    keep_distinct: bool = False,
    progress: bool = True,
    *,
    benchmark: Benchmark = SPIDER,
    db_paths: list[str] | None = None,
    levels: list[str | None] | None = None,
) -> dict:
    """The report (see module docstring) for `preds` against `gold` [(sql, db_id), ...].

    `benchmark` is the family whose rule scores it (sqlrl.benchmarks; Spider's: test-suite EX,
    EM and hardness; BIRD's: EX on result sets and Soft-F1, by difficulty, no EM). `levels`:
    each item's level where the family's data gives it (BIRD's difficulties; Spider derives
    hardness itself). `db_paths` gives each item's database file where db_dir's layout does
    not (a set spread over several folders)."""
    if len(gold) != len(preds):
        raise ScoreInputError(f"{len(gold)} gold items but {len(preds)} predictions")
    schemas = _schemas(tables_json)
    paths = db_paths or [Path(db_dir) / db_id / f"{db_id}.sqlite" for _, db_id in gold]
    items = [
        (str(Path(path).absolute()), sql, pred)
        for path, (sql, _), pred in zip(paths, gold, preds, strict=True)
    ]
    limits = limits or ExecLimits(timeout_s=EVAL_TIMEOUT_S)
    pool = _pool(limits, workers, keep_distinct, benchmark)
    with Progress(len(items), "score", unit="query", enabled=progress) as bar:
        judgements = pool.judge_many(items, progress=bar.update)
    given = (levels if benchmark.levels_given else None) or [None] * len(gold)
    report_items = [
        benchmark.item(i, sql, db_id, pred, judgement, schemas.get(db_id), level)
        for i, ((sql, db_id), pred, judgement, level) in enumerate(
            zip(gold, preds, judgements, given, strict=True)
        )
    ]
    return _summary(report_items, benchmark.level_key, benchmark.levels)


def _schemas(tables_json) -> dict[str, dict]:
    """tables.json entries by db_id."""
    try:
        with open(tables_json, encoding="utf-8") as fh:
            return {entry["db_id"]: entry for entry in json.load(fh)}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ScoreInputError(f"{tables_json}: cannot read the schemas: {exc}") from None


def _pool(
    limits: ExecLimits, workers: int | None, keep_distinct: bool, benchmark: Benchmark
) -> JudgePool:
    """A judge pool per configuration, kept for later calls in this process."""
    key = (limits, workers, keep_distinct, benchmark)
    if key not in _pools:
        _pools[key] = JudgePool(limits, workers, keep_distinct, benchmark=benchmark)
    return _pools[key]


def _fraction(values: list) -> float | None:
    return round(sum(values) / len(values), 6) if values else None


def _fraction_all(items: list[dict]) -> float | None:
    """Share of `items` scored correct, a skipped item counting as wrong."""
    return _fraction([it["ex"] or 0 for it in items])


def _summary(items: list[dict], level_key: str, levels: tuple[str, ...]) -> dict:
    """Fractions over the non-skipped items, per level of the benchmark (Spider's hardness,
    BIRD's difficulty), and error counts."""
    scored = [it for it in items if it["status"] != "skipped"]
    statuses = Counter(it["status"] for it in scored)
    soft_f1 = bool(items) and "soft_f1" in items[0]  # a partial credit beside EX (BIRD's)
    by_level = {}
    for level in levels:
        every = [it for it in items if it[level_key] == level]
        here = [it for it in every if it["status"] != "skipped"]
        by_level[level] = {
            "n": len(here),
            "ex": _fraction([it["ex"] for it in here]),
            "ex_all": _fraction_all(every),
            "em": _fraction([it["em"] for it in here if it["em"] is not None]),
            "skipped": len(every) - len(here),
        }
        if soft_f1:
            by_level[level]["soft_f1"] = _fraction([it["soft_f1"] for it in here])
    telling = [it for it in scored if not it.get("gold_trivial")]
    return {
        "ex": _fraction([it["ex"] for it in scored]),
        # EX over every question, skipped ones counted wrong: what published Spider numbers use
        "ex_all": _fraction_all(items),
        # EX on the questions whose gold result is not trivial (not empty, not only 0/NULL)
        "ex_nontrivial": _fraction([it["ex"] for it in telling]),
        "n_trivial_gold": len(scored) - len(telling),
        "em": _fraction([it["em"] for it in scored if it["em"] is not None]),
        "n": len(scored),
        "skipped": len(items) - len(scored),
        "total": len(items),
        **({"soft_f1": _fraction([it["soft_f1"] for it in scored])} if soft_f1 else {}),
        f"by_{level_key}": by_level,
        "errors": {"error": statuses["error"], "timeout": statuses["timeout"]},
        "gold_failed": sum(1 for it in scored if it["gold_failed"]),
        "items": items,
    }


def read_gold(path) -> list[tuple[str, str]]:
    """(SQL, db_id) per non-blank line of a `SQL<TAB>db_id` file."""
    gold = []
    for number, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        sql, tab, db_id = line.rpartition("\t")
        if not tab or not db_id.strip():
            raise ScoreInputError(f"{path}:{number}: expected `SQL<TAB>db_id`, got {line[:80]!r}")
        gold.append((sql.strip(), db_id.strip()))
    return gold


def read_preds(path) -> list[str]:
    """One SQL per line; an empty line is an empty prediction (it scores 0, as an error)."""
    return [line.strip() for line in _lines(path)]


PREDICTION_KEYS = ("gold", "db_id", "pred")  # a row of data/predictions/*.jsonl


def is_jsonl(path) -> bool:
    """A JSONL predictions file: named *.jsonl, or its first non-blank line is a JSON object."""
    if str(path).endswith(".jsonl"):
        return True
    first = next((line for line in _lines(path) if line.strip()), "")
    return first.lstrip().startswith("{")


def read_prediction_rows(path) -> tuple[list[tuple[str, str]], list[str], list[dict]]:
    """(gold [(SQL, db_id)], predictions, the rows) from the pipeline's predictions JSONL."""
    from sqlrl.errors import PipelineError
    from sqlrl.jsonio import read_jsonl

    try:
        rows = read_jsonl(path, PREDICTION_KEYS)
    except PipelineError as exc:
        raise ScoreInputError(str(exc)) from None
    return [(r["gold"], r["db_id"]) for r in rows], [r["pred"] or "" for r in rows], rows


def _lines(path) -> list[str]:
    """The lines of a UTF-8 file, split at "\n" only: str.splitlines also splits at U+2028,
    U+0085, form feeds and more, which can sit inside one SQL line and would silently shift
    every later prediction. A final newline ends the last line rather than adding one."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScoreInputError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 4]!r})"
        ) from None
    except OSError as exc:
        raise ScoreInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _seconds(text: str) -> float:
    """A finite, positive number of seconds (nan and inf would mean no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.eval.score",
        description=__doc__.split("\n")[0],
        epilog="Formats: the official evaluator's (--gold + --pred, one SQL a line) or the "
        "pipeline's predictions JSONL (--pred data/predictions/NAME.jsonl, gold inside).",
    )
    parser.add_argument(
        "--pred",
        required=True,
        help="one predicted SQL per line, or a predictions JSONL (rows with gold, db_id, pred)",
    )
    parser.add_argument("--gold", help="SQL<TAB>db_id per line (dev_gold.sql); not with JSONL")
    for benchmark in _releases():
        parser.add_argument(f"--{benchmark.name}", help=benchmark.release.help)
    parser.add_argument(
        "--db", help="the folder of <db_id>/<db_id>.sqlite (default SPIDER/database)"
    )
    parser.add_argument("--table", help="tables.json (default SPIDER/tables.json)")
    parser.add_argument("--out", help="where to write the JSON report (default: only the summary)")
    parser.add_argument("--workers", type=int, default=None, help="parallel processes")
    parser.add_argument(
        "--timeout", type=_seconds, default=EVAL_TIMEOUT_S, help="seconds per query (finite, > 0)"
    )
    parser.add_argument(
        "--keep-distinct",
        action="store_true",
        help="compare with DISTINCT kept (the test suite removes it by default)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _releases() -> list[Benchmark]:
    """The registered families whose release folder the command line can name."""
    return [benchmark for benchmark in BENCHMARKS.values() if benchmark.release is not None]


@dataclass
class Inputs:
    """What one scoring run compares, resolved from the command line."""

    gold: list[tuple[str, str]]
    preds: list[str]
    db: str
    table: str
    benchmark: Benchmark = SPIDER
    levels: list[str | None] | None = None


BIRD_MARK = "\t----- bird -----\t"  # BIRD's predict_dev.json: "SQL<mark>db_id"


def _release(args) -> tuple[Benchmark, str | None]:
    """(the family a --<name> DIR option names, DIR); Spider's and no folder without one.
    With several, the last registered wins (--bird over --spider)."""
    given = [(b, getattr(args, b.name)) for b in _releases() if getattr(args, b.name)]
    return given[-1] if given else (SPIDER, None)


def _named_in_rows(rows: list[dict]) -> Benchmark | None:
    """The first family other than Spider's that a predictions row names in `format` (the
    evaluate stage writes it in a set's rows; names not registered are ignored)."""
    named = (BENCHMARKS.get(row.get("format")) for row in rows)
    return next((b for b in named if b is not None and b is not SPIDER), None)


def _inputs(args, parser) -> Inputs:
    """Gold, predictions, databases, tables file and benchmark from the command line."""
    benchmark, release = _release(args)
    db = args.db or (release and str(Path(release) / benchmark.release.databases))
    table = args.table or (release and str(Path(release) / benchmark.release.tables))
    if not (db and table):
        names = " or ".join(f"--{b.name} DIR" for b in _releases())
        parser.error(f"give {names}, or both --db and --table")
    gold = read_gold(args.gold) if args.gold else None  # named first when both are unreadable
    if is_jsonl(args.pred) and not is_bird_predictions(args.pred):
        if args.gold:
            parser.error(f"{args.pred} is a predictions JSONL: its rows hold the gold, drop --gold")
        gold, preds, rows = read_prediction_rows(args.pred)
        if benchmark is SPIDER:  # --spider only says where the files are
            benchmark = _named_in_rows(rows) or SPIDER
        levels = [row.get(benchmark.level_key) for row in rows] if benchmark.levels_given else None
        return Inputs(gold, preds, db, table, benchmark, levels)
    release_gold = release and benchmark.release.gold
    gold_file = args.gold or (release_gold and str(Path(release) / release_gold))
    if not gold_file:
        parser.error("--gold is needed with one SQL a line (or give a predictions JSONL)")
    gold = gold if gold is not None else read_gold(gold_file)
    preds = read_bird_predictions(args.pred) if is_bird_predictions(args.pred) else None
    if preds is None:
        preds = read_preds(args.pred)
        # a file that ends in blank lines has no predictions there: drop them before counting
        while len(preds) > len(gold) and preds and not preds[-1]:
            preds.pop()
    if len(gold) != len(preds):
        raise ScoreInputError(
            f"{gold_file} has {len(gold)} gold items but {args.pred} has "
            f"{len(preds)} predictions; they must match line for line"
        )
    if release is None:
        return Inputs(gold, preds, db, table)
    try:
        levels = benchmark.release_levels(release, len(gold))
    except ValueError as exc:
        raise ScoreInputError(str(exc)) from None
    return Inputs(gold, preds, db, table, benchmark, levels)


def is_bird_predictions(path) -> bool:
    """BIRD's predict_dev.json: one JSON object mapping question indices to marked SQL."""
    if not str(path).endswith(".json"):
        return False
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(isinstance(v, str) for v in data.values())


def read_bird_predictions(path) -> list[str]:
    """The SQL of BIRD's predict_dev.json, in question order (the text before BIRD's mark)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    try:
        order = sorted(data, key=int)
    except ValueError:
        raise ScoreInputError(f"{path}: keys must be question indices (0, 1, ...)") from None
    if [int(k) for k in order] != list(range(len(order))):
        raise ScoreInputError(f"{path}: question indices must run 0..{len(order) - 1}")
    return [data[k].split(BIRD_MARK)[0].strip() for k in order]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        inputs = _inputs(args, parser)
        report = score_predictions(
            inputs.gold,
            inputs.preds,
            inputs.db,
            inputs.table,
            args.workers,
            ExecLimits(timeout_s=args.timeout),
            args.keep_distinct,
            progress=not args.no_progress,
            benchmark=inputs.benchmark,
            levels=inputs.levels,
        )
    except (ScoreInputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            print(
                f"error: cannot write the report to {args.out}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
    for line in inputs.benchmark.report_lines(report, args.out):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
