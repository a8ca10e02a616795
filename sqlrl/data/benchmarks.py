"""Evaluation sets beside Spider dev and held-out, read by their own formats.

One adapter per file format, each producing `Example`s (with BIRD's evidence and difficulty
where the format has them) and each example's database file:
- `spider`: Spider's layout (a question list with `question` and `query`, a tables.json, and
  database folders `<db_id>/<db_id>.sqlite`); Spider-DK and Spider-Syn are this format with
  their own files (Spider-Syn asks its `SpiderSynQuestion`), and so is a user's own set.
- `bird`: BIRD's (`question`, `evidence`, `SQL`, `difficulty`; `dev_tables.json` in Spider's
  tables format; `dev_databases/<db_id>/<db_id>.sqlite`).
A set names its files in params (eval.sets; prepare.extra_train_sets for training sets, read
here too), relative to data/raw/; a database it lacks is
skipped and counted, never scored as wrong, so a user with every database scores every
question with no change of code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from sqlrl.data.prepare import recorded_path
from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.data.prompts import PromptFactory
from sqlrl.data.spider import SPIDER_FIELDS, Example, Fields, SpiderDataError, load_examples
from sqlrl.data.spider import load_schemas as load_tables

FORMAT_FIELDS = {
    "spider": SPIDER_FIELDS,
    "bird": Fields(question="question", query="SQL", evidence="evidence", difficulty="difficulty"),
}
SET_ROW_KEYS = ("question", "gold", "db_id", "db_path", "db_present", "prompt", "evidence")


@dataclass(frozen=True)
class Databases:
    """The folders a set's databases may be in, searched in order (Spider-DK's own three
    first, then Spider's)."""

    folders: tuple[Path, ...]

    def path(self, db_id: str) -> Path:
        """The first folder's file that exists; the first folder's (absent) path otherwise."""
        candidates = [folder / db_id / f"{db_id}.sqlite" for folder in self.folders]
        return next((path for path in candidates if path.is_file()), candidates[0])


def load_set(
    name: str, spec, raw_dir: str | Path, setting: str = "eval.sets"
) -> tuple[list[Example], dict, Databases]:
    """A set's examples, schemas and databases, from `spec` (EvalSetParams). A missing or
    malformed file is one error naming the set (as `setting`.name) and the file (and the
    item)."""
    raw_dir = Path(raw_dir)
    fields = FORMAT_FIELDS[spec.format]
    if spec.question_key:
        fields = replace(fields, question=spec.question_key)
    for path in (raw_dir / spec.questions, raw_dir / spec.tables):
        if not path.is_file():
            raise SpiderDataError(
                f"{setting}.{name}: {path}: no such file (copy its .dvc pointer to data/raw/ "
                "and `dvc pull` it, or fix the path in params)"
            )
    try:
        schemas = load_tables(raw_dir / spec.tables)
        examples = load_examples(raw_dir / spec.questions, schemas, fields)
    except SpiderDataError as exc:
        raise SpiderDataError(f"{setting}.{name}: {exc}") from None
    return examples, schemas, Databases(tuple(raw_dir / d for d in spec.databases))


def prepare_set(
    name: str, spec, raw_dir: str | Path, settings: PromptSettings, max_examples: int = 0
) -> tuple[list[dict], dict]:
    """(evaluation rows, counts) of one set. Rows whose database is absent have no prompt
    (scored as skipped); `max_examples` keeps the first N runnable ones (0 = all)."""
    examples, schemas, databases = load_set(name, spec, raw_dir)
    prompts = PromptFactory(settings, schemas, None, locate=databases.path)
    present = {ex.db_id: databases.path(ex.db_id).is_file() for ex in examples}
    runnable = [ex for ex in examples if present[ex.db_id]]
    if max_examples:
        runnable = runnable[:max_examples]
    kept = set(map(id, runnable))
    rows = [
        _row(ex, databases, prompts, spec.format)
        for ex in examples
        if id(ex) in kept or not present[ex.db_id]
    ]
    absent = sorted({ex.db_id for ex in examples if not present[ex.db_id]})
    return rows, {
        "format": spec.format,
        "examples": len(rows),
        "runnable": len(runnable),
        "skipped_db_absent": len(rows) - len(runnable),
        "absent_databases": absent,
    }


def _row(example: Example, databases: Databases, prompts: PromptFactory, fmt: str) -> dict:
    db_path = databases.path(example.db_id)
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
        "evidence": example.evidence,
        "format": fmt,
    }
    if example.difficulty is not None:
        row["difficulty"] = example.difficulty
    return row
