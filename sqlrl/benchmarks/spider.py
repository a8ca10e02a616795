"""Spider's rules (and those of the sets in its format: Spider-DK, Spider-Syn, a user's own).

- Fields: `question` and `query` (sqlrl.data.spider reads the files).
- EX: the test-suite evaluator's (sqlrl.sql.equality): rows as a multiset, in order when the
  gold query sorts, columns in any order; DISTINCT removed from both queries unless
  keep_distinct, split comparison operators joined. A vote groups results the same way,
  unordered (there is no gold to say whether order matters).
- The judge may stop reading a prediction's rows past the gold result's count (more rows
  are never an equal multiset).
- Levels: hardness (easy, medium, hard, extra), derived from the gold SQL and its schema by
  Spider's official rules (sqlrl.eval.spider_eval), with EM, exact set match, beside EX.
SQL comparison and the official evaluator's rules are imported when first used: sqlrl.params
imports this module through the registry and stays light.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlrl.benchmarks.base import Benchmark, Release, item_error, percent
from sqlrl.data.spider import SPIDER_FIELDS

HARDNESS_LEVELS = ("easy", "medium", "hard", "extra")


@dataclass(frozen=True)
class SpiderBenchmark(Benchmark):
    """Test-suite execution accuracy with Spider's exact match and hardness."""

    def prepare_sql(self, sql, keep_distinct: bool, max_chars: int):
        """DISTINCT handling and operator joining; oversized text goes on to be refused."""
        from sqlrl.sql.equality import normalize_sql

        if isinstance(sql, str) and len(sql) <= max_chars:
            return normalize_sql(sql, keep_distinct)
        return sql

    def compare(self, gold_rows, pred_rows, gold_sql: str) -> tuple[bool, float | None]:
        from sqlrl.sql.equality import order_matters, results_match

        return results_match(gold_rows, pred_rows, order_matters(gold_sql)), None

    def same_result(self, a, b) -> bool:
        from sqlrl.sql.equality import results_match

        return results_match(a, b, ordered=False)

    def item(self, index, gold_sql, db_id, pred, judgement, schema, level) -> dict:
        """EX, and with the schema known, the gold's hardness and EM (`level` is not given:
        hardness comes from the gold SQL)."""
        from sqlrl.eval.spider_eval import exact_match, hardness

        status = judgement.status
        skipped = status == "skipped"
        level = em = None
        if schema is not None:
            level = _safely(hardness, gold_sql, schema)
            if not skipped:
                em = int(bool(_safely(exact_match, gold_sql, pred, schema)))
        return {
            "index": index,
            "db_id": db_id,
            "hardness": level,
            "status": status,
            "ex": None if skipped else int(judgement.match),
            "em": em,
            "error": item_error(judgement, db_id, schema, "tables.json"),
            "gold_failed": judgement.gold_status not in ("ok", "skipped"),
            "gold_trivial": judgement.gold_trivial,
        }

    def report_lines(self, report: dict, out: str | None) -> list[str]:
        return [
            f"EX {percent(report['ex'])}  EM {percent(report['em'])}  n={report['n']} "
            f"skipped={report['skipped']}  EX with skipped as wrong {percent(report['ex_all'])}"
            f"  errors={report['errors']}" + (f"  -> {out}" if out else "")
        ]


def _safely(fn, *args):
    """EM and hardness parse SQL; a prediction they cannot parse is simply not a match."""
    try:
        return fn(*args)
    except Exception:
        return None


SPIDER = SpiderBenchmark(
    name="spider",
    fields=SPIDER_FIELDS,
    level_key="hardness",
    levels=HARDNESS_LEVELS,
    stops_early=True,
    release=Release(
        databases="database",
        tables="tables.json",
        help="a Spider release folder: its database/ and tables.json",
    ),
)
