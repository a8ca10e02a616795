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
it BIRD mini_dev's Soft-F1 (`soft_f1`: partial credit per row, see sqlrl.sql.judge.bird_soft_f1;
a query that fails scores 0), averaged over the questions, overall and per difficulty. PRED is
BIRD's predict_dev.json ({"0": "SQL\t----- bird -----\tdb_id", ...}), one SQL a line, or
the pipeline's predictions JSONL (a row with `"format": "bird"` selects BIRD's rule itself).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sqlrl.progress import Progress
from sqlrl.sql.executor import ExecLimits
from sqlrl.sql.judge import Judgement, JudgePool

HARDNESS_LEVELS = ("easy", "medium", "hard", "extra")
BIRD_LEVELS = ("simple", "moderate", "challenging")
EVAL_TIMEOUT_S = 10.0  # per query; rewards use 5 s, evaluation can afford more
_ERROR_CHARS = 200
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
    rules: str = "spider",
    db_paths: list[str] | None = None,
    difficulties: list[str | None] | None = None,
) -> dict:
    """The report (see module docstring) for `preds` against `gold` [(sql, db_id), ...].

    `rules` is the benchmark's: "spider" (test-suite EX, EM and hardness) or "bird" (EX on
    result sets, reported by BIRD's `difficulties`; no EM). `db_paths` gives each item's
    database file where db_dir's layout does not (a set spread over several folders)."""
    if len(gold) != len(preds):
        raise ScoreInputError(f"{len(gold)} gold items but {len(preds)} predictions")
    schemas = _schemas(tables_json)
    paths = db_paths or [Path(db_dir) / db_id / f"{db_id}.sqlite" for _, db_id in gold]
    items = [
        (str(Path(path).absolute()), sql, pred)
        for path, (sql, _), pred in zip(paths, gold, preds, strict=True)
    ]
    limits = limits or ExecLimits(timeout_s=EVAL_TIMEOUT_S)
    pool = _pool(limits, workers, keep_distinct, rules)
    with Progress(len(items), "score", unit="query", enabled=progress) as bar:
        judgements = pool.judge_many(items, progress=bar.update)
    if rules == "bird":
        levels = difficulties or [None] * len(gold)
        report_items = [
            _bird_item(i, db_id, judgement, level, schemas.get(db_id))
            for i, ((_, db_id), judgement, level) in enumerate(
                zip(gold, judgements, levels, strict=True)
            )
        ]
        return _summary(report_items, "difficulty", BIRD_LEVELS)
    report_items = [
        _item(i, sql, db_id, pred, judgement, schemas.get(db_id))
        for i, ((sql, db_id), pred, judgement) in enumerate(
            zip(gold, preds, judgements, strict=False)
        )
    ]
    return _summary(report_items)


def _schemas(tables_json) -> dict[str, dict]:
    """tables.json entries by db_id."""
    try:
        with open(tables_json, encoding="utf-8") as fh:
            return {entry["db_id"]: entry for entry in json.load(fh)}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ScoreInputError(f"{tables_json}: cannot read the schemas: {exc}") from None


def _pool(limits: ExecLimits, workers: int | None, keep_distinct: bool, rules: str) -> JudgePool:
    """A judge pool per configuration, kept for later calls in this process."""
    key = (limits, workers, keep_distinct, rules)
    if key not in _pools:
        _pools[key] = JudgePool(limits, workers, keep_distinct, semantics=rules)
    return _pools[key]


def _item(
    index: int,
    gold_sql: str,
    db_id: str,
    pred: str,
    judgement: Judgement,
    schema: dict | None,
) -> dict:
    """One line of the report."""
    from sqlrl.eval.spider_eval import exact_match, hardness

    status = judgement.status
    skipped = status == "skipped"
    level = em = None
    if schema is not None:
        level = _safely(hardness, gold_sql, schema)
        if not skipped:
            em = int(bool(_safely(exact_match, gold_sql, pred, schema)))
    error = judgement.error if status != "ok" or not judgement.match else ""
    if schema is None:
        error = (error + "; " if error else "") + f"db_id {db_id!r} is not in tables.json"
    return {
        "index": index,
        "db_id": db_id,
        "hardness": level,
        "status": status,
        "ex": None if skipped else int(judgement.match),
        "em": em,
        "error": error[:_ERROR_CHARS],
        "gold_failed": judgement.gold_status not in ("ok", "skipped"),
        "gold_trivial": judgement.gold_trivial,
    }


def _bird_item(
    index: int, db_id: str, judgement: Judgement, difficulty: str | None, schema: dict | None
) -> dict:
    """One line of a BIRD report: EX as BIRD's evaluator counts it, and the difficulty."""
    status = judgement.status
    error = judgement.error if status != "ok" or not judgement.match else ""
    if schema is None:
        error = (error + "; " if error else "") + f"db_id {db_id!r} is not in the tables file"
    return {
        "index": index,
        "db_id": db_id,
        "difficulty": difficulty,
        "status": status,
        "ex": None if status == "skipped" else int(judgement.match),
        # a query that failed (either one) scores 0, as in BIRD's evaluation_f1.py
        "soft_f1": None if status == "skipped" else judgement.soft_f1 or 0.0,
        "em": None,
        "error": error[:_ERROR_CHARS],
        "gold_failed": judgement.gold_status not in ("ok", "skipped"),
        "gold_trivial": judgement.gold_trivial,
    }


def _safely(fn, *args):
    """EM and hardness parse SQL; a prediction they cannot parse is simply not a match."""
    try:
        return fn(*args)
    except Exception:
        return None


def _fraction(values: list) -> float | None:
    return round(sum(values) / len(values), 6) if values else None


def _fraction_all(items: list[dict]) -> float | None:
    """Share of `items` scored correct, a skipped item counting as wrong."""
    return _fraction([it["ex"] or 0 for it in items])


def _summary(
    items: list[dict], level_key: str = "hardness", levels: tuple[str, ...] = HARDNESS_LEVELS
) -> dict:
    """Fractions over the non-skipped items, per level (Spider's hardness or BIRD's
    difficulty), and error counts."""
    scored = [it for it in items if it["status"] != "skipped"]
    statuses = Counter(it["status"] for it in scored)
    soft_f1 = bool(items) and "soft_f1" in items[0]  # BIRD's rule: its Soft-F1 beside EX
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
    parser.add_argument("--spider", help="a Spider release folder: its database/ and tables.json")
    parser.add_argument(
        "--bird",
        help="a BIRD release folder (dev_databases/, dev_tables.json, dev_gold.sql, dev.json): "
        "BIRD's rule, EX on result sets by difficulty",
    )
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


@dataclass
class Inputs:
    """What one scoring run compares, resolved from the command line."""

    gold: list[tuple[str, str]]
    preds: list[str]
    db: str
    table: str
    rules: str = "spider"
    difficulties: list[str | None] | None = None


BIRD_FILES = {"db": "dev_databases", "table": "dev_tables.json", "gold": "dev_gold.sql"}
BIRD_MARK = "\t----- bird -----\t"  # BIRD's predict_dev.json: "SQL<mark>db_id"


def _inputs(args, parser) -> Inputs:
    """Gold, predictions, databases, tables file and rules from the command line."""
    release = args.bird or args.spider
    files = BIRD_FILES if args.bird else {"db": "database", "table": "tables.json"}
    db = args.db or (release and str(Path(release) / files["db"]))
    table = args.table or (release and str(Path(release) / files["table"]))
    if not (db and table):
        parser.error("give --spider DIR or --bird DIR, or both --db and --table")
    gold = read_gold(args.gold) if args.gold else None  # named first when both are unreadable
    if is_jsonl(args.pred) and not is_bird_predictions(args.pred):
        if args.gold:
            parser.error(f"{args.pred} is a predictions JSONL: its rows hold the gold, drop --gold")
        gold, preds, rows = read_prediction_rows(args.pred)
        bird = bool(args.bird) or any(row.get("format") == "bird" for row in rows)
        levels = [row.get("difficulty") for row in rows] if bird else None
        return Inputs(gold, preds, db, table, "bird" if bird else "spider", levels)
    gold_file = args.gold or (args.bird and str(Path(args.bird) / BIRD_FILES["gold"]))
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
    if not args.bird:
        return Inputs(gold, preds, db, table)
    return Inputs(gold, preds, db, table, "bird", read_difficulties(args.bird, len(gold)))


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


def read_difficulties(bird_dir, n: int) -> list[str | None]:
    """Each question's difficulty from the release's dev.json (None where it has none)."""
    path = Path(bird_dir) / "dev.json"
    if not path.is_file():
        return [None] * n
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ScoreInputError(f"{path}: not valid JSON: {exc}") from None
    if len(items) != n:
        raise ScoreInputError(f"{path} has {len(items)} questions but the gold has {n}")
    return [item.get("difficulty") for item in items]


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
            rules=inputs.rules,
            difficulties=inputs.difficulties,
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
    if inputs.rules == "bird":
        levels = "  ".join(
            f"{level} {_percent(m['ex'])} (n={m['n']})"
            for level, m in report["by_difficulty"].items()
        )
        print(f"BIRD EX {_percent(report['ex'])}  {levels}  skipped={report['skipped']}")
        levels = "  ".join(
            f"{level} {_percent(m['soft_f1'])}" for level, m in report["by_difficulty"].items()
        )
        print(f"BIRD Soft-F1 {_percent(report['soft_f1'])}  {levels}")
        return 0
    print(
        f"EX {_percent(report['ex'])}  EM {_percent(report['em'])}  n={report['n']} "
        f"skipped={report['skipped']}  EX with skipped as wrong {_percent(report['ex_all'])}"
        f"  errors={report['errors']}" + (f"  -> {args.out}" if args.out else "")
    )
    return 0


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


if __name__ == "__main__":
    sys.exit(main())
