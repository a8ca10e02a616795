"""BIRD's rules, as its own evaluation scripts apply them.

- Fields: `question`, `SQL`, `evidence` (external knowledge, put in the prompt) and
  `difficulty`; `dev_tables.json` is in Spider's tables format.
- EX: BIRD's evaluation_ex.py: the SQL runs as written (no DISTINCT rewriting), the two
  results compared as sets of rows (row order and duplicates do not count, column order
  does); votes group results the same way. Beside it, mini_dev's Soft-F1 (bird_soft_f1).
- The judge reads every predicted row: more rows than the gold result can still be an equal
  set.
- Levels: the difficulty each question carries (simple, moderate, challenging); no EM.
- Release folder (score's --bird DIR): dev_databases/, dev_tables.json, dev_gold.sql, and
  dev.json for the difficulties.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sqlrl.benchmarks.base import Benchmark, Release, item_error, percent
from sqlrl.data.spider import Fields

DIFFICULTY_LEVELS = ("simple", "moderate", "challenging")


def bird_results_match(gold_rows, pred_rows) -> bool:
    """BIRD's official EX (its evaluation_ex.py): the two results as sets of rows, so row
    order and duplicate rows do not count, column order does."""
    return set(gold_rows) == set(pred_rows)


def bird_soft_f1(gold_rows, pred_rows) -> float:
    """BIRD mini_dev's Soft-F1 (its evaluation_f1.py), partial credit where EX gives none.

    Duplicate rows are dropped (first occurrence kept) and the i-th predicted row is paired
    with the i-th gold row, so unlike BIRD's EX, row order counts. In a pair, each predicted
    value found in the gold row is matched, each one not found is predicted-only, and each
    gold value not in the predicted row is gold-only, all divided by the gold row's width; a
    gold row without a partner is 1 gold-only, a predicted row without one 1 predicted-only.
    F1 of precision matched / (matched + predicted-only) and recall matched / (matched +
    gold-only); two empty results score 1.
    """
    gold = list(dict.fromkeys(gold_rows))
    pred = list(dict.fromkeys(pred_rows))
    if not gold and not pred:
        return 1.0
    matched = pred_only = gold_only = 0.0
    for gold_row, pred_row in zip(gold, pred, strict=False):
        width = len(gold_row)
        matched += sum(value in gold_row for value in pred_row) / width
        pred_only += sum(value not in gold_row for value in pred_row) / width
        gold_only += sum(value not in pred_row for value in gold_row) / width
    gold_only += max(0, len(gold) - len(pred))
    pred_only += max(0, len(pred) - len(gold))
    precision = matched / (matched + pred_only) if matched + pred_only else 0.0
    recall = matched / (matched + gold_only) if matched + gold_only else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


@dataclass(frozen=True)
class BirdBenchmark(Benchmark):
    """Set-based execution accuracy with Soft-F1, reported by difficulty."""

    def compare(self, gold_rows, pred_rows, gold_sql: str) -> tuple[bool, float | None]:
        return bird_results_match(gold_rows, pred_rows), bird_soft_f1(gold_rows, pred_rows)

    def same_result(self, a, b) -> bool:
        return bird_results_match(a, b)

    def item(self, index, gold_sql, db_id, pred, judgement, schema, level) -> dict:
        """EX as BIRD's evaluator counts it, Soft-F1 and the difficulty the data gives."""
        status = judgement.status
        return {
            "index": index,
            "db_id": db_id,
            "difficulty": level,
            "status": status,
            "ex": None if status == "skipped" else int(judgement.match),
            # a query that failed (either one) scores 0, as in BIRD's evaluation_f1.py
            "soft_f1": None if status == "skipped" else judgement.soft_f1 or 0.0,
            "em": None,
            "error": item_error(judgement, db_id, schema, "the tables file"),
            "gold_failed": judgement.gold_status not in ("ok", "skipped"),
            "gold_trivial": judgement.gold_trivial,
        }

    def report_lines(self, report: dict, out: str | None) -> list[str]:
        by_level = report[f"by_{self.level_key}"]
        ex = "  ".join(f"{level} {percent(m['ex'])} (n={m['n']})" for level, m in by_level.items())
        f1 = "  ".join(f"{level} {percent(m['soft_f1'])}" for level, m in by_level.items())
        return [
            f"BIRD EX {percent(report['ex'])}  {ex}  skipped={report['skipped']}",
            f"BIRD Soft-F1 {percent(report['soft_f1'])}  {f1}",
        ]

    def release_levels(self, folder, n: int) -> list[str | None]:
        """Each question's difficulty from the release's dev.json (None where it has none;
        all None without the file). ValueError when the file does not fit the gold."""
        path = Path(folder) / "dev.json"
        if not path.is_file():
            return [None] * n
        try:
            items = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
        if len(items) != n:
            raise ValueError(f"{path} has {len(items)} questions but the gold has {n}")
        return [item.get(self.level_key) for item in items]


BIRD = BirdBenchmark(
    name="bird",
    fields=Fields(question="question", query="SQL", evidence="evidence", difficulty="difficulty"),
    level_key="difficulty",
    levels=DIFFICULTY_LEVELS,
    levels_given=True,
    release=Release(
        databases="dev_databases",
        tables="dev_tables.json",
        gold="dev_gold.sql",
        help="a BIRD release folder (dev_databases/, dev_tables.json, dev_gold.sql, dev.json): "
        "BIRD's rule, EX on result sets by difficulty",
    ),
)
