"""The evaluation row, built in one place for Spider's dev and held-out splits (prepare) and
for every set of eval.sets (prepare_eval, sqlrl/benchmarks/sets.py), and how rows record a
database's path. Its own module, so that both preparations import it and neither imports the
other.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlrl.data.prompts import PromptFactory
from sqlrl.data.spider import Example


def recorded_path(path: str | Path) -> str:
    """`path` as rows record it: POSIX and relative to the working directory when inside it
    (symlinks not followed, so a linked Spider keeps its path in the repo), else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(os.path.abspath(os.curdir)).as_posix()
    except ValueError:
        return absolute.as_posix()


def eval_row(
    example: Example, db_path: Path, prompts: PromptFactory, benchmark: str | None = None
) -> dict:
    """An evaluation row; no prompt when the database is absent (it is scored as skipped).
    A set's row (`benchmark`: its family's name) also records the question's evidence (in its
    prompt too), the family its scoring looks up, and the level the data gives; Spider's
    dev and held-out rows leave those out, as they always have (scored by Spider's rule)."""
    present = db_path.is_file()
    row = {
        "question": example.question,
        "gold": example.query,
        "db_id": example.db_id,
        "db_path": recorded_path(db_path),
        "db_present": present,
        "prompt": (
            prompts.messages(example.db_id, example.question, example.evidence) if present else None
        ),
    }
    if benchmark is None:
        return row
    row["evidence"] = example.evidence
    row["format"] = benchmark
    if example.difficulty is not None:
        row["difficulty"] = example.difficulty
    return row
