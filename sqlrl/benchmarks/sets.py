"""Evaluation sets beside Spider dev and held-out, each read by its benchmark family's fields.

A set names its family in params (eval.sets[...].format; prepare.extra_train_sets for training
sets, read here too) and its files relative to data/raw/. The family (sqlrl.benchmarks) says
which keys its question files use; the files are in Spider's layout otherwise (a question
list, a tables file, database folders `<db_id>/<db_id>.sqlite`):
- Spider's: `question` and `query`; Spider-DK and Spider-Syn are this format with their own
  files (Spider-Syn asks its `SpiderSynQuestion`), and so is a user's own set.
- BIRD's: `question`, `evidence`, `SQL`, `difficulty`; `dev_tables.json`;
  `dev_databases/<db_id>/<db_id>.sqlite`.
A database a set lacks is skipped and counted, never scored as wrong, so a user with every
database scores every question with no change of code. Not imported by the registry: it
builds prompts, which the light users of sqlrl.benchmarks (params, the judge) do not need.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from sqlrl.benchmarks import get_benchmark
from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.data.prompts import PromptFactory
from sqlrl.data.rows import eval_row
from sqlrl.data.spider import Example, SpiderDataError, load_examples
from sqlrl.data.spider import load_schemas as load_tables


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
    fields = get_benchmark(spec.format).fields
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
        eval_row(ex, databases.path(ex.db_id), prompts, spec.format)
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
