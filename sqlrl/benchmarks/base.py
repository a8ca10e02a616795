"""What a benchmark family is to the pipeline, so that its rules live in one file.

A benchmark family (Spider's, BIRD's: sqlrl/benchmarks/spider.py, bird.py) is a `Benchmark`:
how its question files name their fields, when two results are equal (EX, and the same
equality for self-consistency votes), how the judge runs its SQL, its levels (Spider's
hardness, BIRD's difficulty), one report item per question and the lines `python -m
sqlrl.eval.score` prints. The judge, scoring, voting and evaluation take the object and ask
it; none of them compares the family's name. Adding a family is a subclass in a new file and
its line in sqlrl/benchmarks/__init__.py.

Nothing here imports more than the standard library and the Spider reader's `Fields` (a
family's own heavier code is imported when first used), so that sqlrl.params can take its
allowed formats from the registry at import time. The judge is not imported even for type
names: every stage imports params, and with it each module named here (dvc.yaml lists them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlrl.data.spider import Fields

ERROR_CHARS = 200  # a report item's error, cut to this many characters


@dataclass(frozen=True)
class Release:
    """Where a family's release folder keeps its files, for `python -m sqlrl.eval.score
    --<name> DIR`: the database folder, the tables file and, where the release has one, the
    gold file (`SQL<TAB>db_id` a line)."""

    databases: str
    tables: str
    gold: str | None = None
    help: str = ""  # the command line's help for --<name>


@dataclass(frozen=True)
class Benchmark:
    """One benchmark family's rules. Frozen and made of plain values, so that it is hashable
    (scoring keeps a judge pool per configuration) and pickles into the judge's worker
    processes, a family defined outside the package (a test's) included."""

    name: str  # what params (eval.sets[...].format) and prediction rows (`format`) call it
    fields: Fields  # the keys of its question files
    level_key: str  # the report item's key for a question's level, and `by_<level_key>`
    levels: tuple[str, ...]  # the levels reported, in order
    # the question files give each question's level (BIRD's difficulty), rather than the
    # scorer deriving it from the gold SQL (Spider's hardness)
    levels_given: bool = False
    # with the judge's shortcuts, a prediction's rows stop being read once it has more than
    # the gold result: sound only where more rows can never be equal (multisets, lists)
    stops_early: bool = False
    release: Release | None = None

    def prepare_sql(self, sql, keep_distinct: bool, max_chars: int):
        """The SQL as the judge runs it (both the gold and the prediction); as written by
        default."""
        return sql

    def compare(self, gold_rows, pred_rows, gold_sql: str) -> tuple[bool, float | None]:
        """(EX match, partial credit or None) of two results of queries that both ran."""
        raise NotImplementedError

    def same_result(self, a, b) -> bool:
        """Two candidates' results are one group in a self-consistency vote: equal as EX
        compares results (no gold, so no order from it)."""
        raise NotImplementedError

    def item(
        self,
        index: int,
        gold_sql: str,
        db_id: str,
        pred: str,
        judgement,
        schema: dict | None,
        level: str | None,
    ) -> dict:
        """One question's line of the score report, from the `judgement` of its prediction
        (sqlrl.sql.judge.Judgement). `schema` is its tables-file entry (None when the file
        lacks the database); `level` the one the data gives (levels_given)."""
        raise NotImplementedError

    def report_lines(self, report: dict, out: str | None) -> list[str]:
        """What `python -m sqlrl.eval.score` prints of a report (`out`: where it was written)."""
        raise NotImplementedError

    def release_levels(self, folder: str | Path, n: int) -> list[str | None] | None:
        """Each of the `n` questions' level as a release folder gives it (None: not given)."""
        return None


def item_error(judgement, db_id: str, schema: dict | None, tables: str) -> str:
    """A report item's error: the judgement's when it did not match, and a note when the
    tables file (called `tables` in the note) lacks the database."""
    error = judgement.error if judgement.status != "ok" or not judgement.match else ""
    if schema is None:
        error = (error + "; " if error else "") + f"db_id {db_id!r} is not in {tables}"
    return error[:ERROR_CHARS]


def percent(value: float | None) -> str:
    """A fraction as the score command prints it."""
    return "n/a" if value is None else f"{100 * value:.2f}%"
