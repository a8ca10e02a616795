"""Reading the Spider 1.0 release layout: tables.json, the question files, database/.

Errors name the file and the item. An example whose database file is absent is not an error:
the data card says to count it as skipped (this copy lacks wta_1, baseball_1 and soccer_1).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from sqlrl.errors import PipelineError

PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a name SQL needs no quotes for


class SpiderDataError(PipelineError, ValueError):
    """A Spider file is missing or malformed; the message names the file and the item."""


@dataclass(frozen=True)
class Column:
    name: str  # original name, as SQL uses it
    type: str  # tables.json type: text, number, time, boolean, others
    is_primary: bool


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class ForeignKey:
    table: str
    column: str
    ref_table: str
    ref_column: str


@dataclass(frozen=True)
class Schema:
    db_id: str
    tables: tuple[Table, ...]
    foreign_keys: tuple[ForeignKey, ...]


@dataclass(frozen=True)
class Example:
    """One question of any benchmark format (sqlrl/benchmarks/sets.py reads the others)."""

    db_id: str
    question: str
    query: str
    source: str  # file name and index, for error messages and provenance
    evidence: str = ""  # BIRD's external knowledge for the question; empty for Spider
    difficulty: str | None = None  # BIRD's simple | moderate | challenging


def read_json(path: Path) -> object:
    """json.load with an error that names the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise SpiderDataError(f"{path}: file not found (did you run `dvc pull`?)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpiderDataError(f"{path}: not valid JSON: {exc}") from None


def schema_from_entry(entry: dict, where: str) -> Schema:
    """One tables.json entry -> Schema, using the original (SQL) names."""
    try:
        db_id = entry["db_id"]
        table_names = entry["table_names_original"]
        columns = entry["column_names_original"]
        types = entry["column_types"]
        primary = set(_flatten(entry.get("primary_keys", [])))
        fks = entry.get("foreign_keys", [])
    except (KeyError, TypeError) as exc:
        raise SpiderDataError(f"{where}: missing field {exc}") from None
    if not table_names:
        raise SpiderDataError(f"{where}: database {db_id!r} has a schema with no tables")
    if len(types) != len(columns):
        raise SpiderDataError(
            f"{where}: {db_id!r} has {len(columns)} columns but {len(types)} column types"
        )
    per_table: list[list[Column]] = [[] for _ in table_names]
    for idx, ((table_idx, name), col_type) in enumerate(zip(columns, types, strict=False)):
        if table_idx < 0:
            continue  # the "*" pseudo-column
        if table_idx >= len(table_names):
            raise SpiderDataError(
                f"{where}: {db_id!r} column {name!r} points at table "
                f"#{table_idx}, which does not exist"
            )
        per_table[table_idx].append(Column(name, col_type, idx in primary))
    foreign_keys = []
    for src, dst in fks:
        (s_table, s_col), (d_table, d_col) = columns[src], columns[dst]
        foreign_keys.append(ForeignKey(table_names[s_table], s_col, table_names[d_table], d_col))
    tables = tuple(
        Table(name, tuple(cols)) for name, cols in zip(table_names, per_table, strict=False)
    )
    return Schema(db_id, tables, tuple(foreign_keys))


def _flatten(keys: list) -> list[int]:
    """primary_keys holds ints, or lists of ints for composite keys."""
    out: list[int] = []
    for key in keys:
        out.extend(key if isinstance(key, list) else [key])
    return out


def load_schemas(tables_json: Path) -> dict[str, Schema]:
    """All schemas of tables.json by db_id."""
    entries = read_json(tables_json)
    if not isinstance(entries, list):
        raise SpiderDataError(f"{tables_json}: expected a list of schemas")
    return {e["db_id"]: schema_from_entry(e, f"{tables_json} [{i}]") for i, e in enumerate(entries)}


@dataclass(frozen=True)
class Fields:
    """Which keys of a question file's items hold what (the formats differ in names only)."""

    question: str = "question"
    query: str = "query"
    evidence: str | None = None  # optional key: a missing or null one is empty evidence
    difficulty: str | None = None


SPIDER_FIELDS = Fields()


def load_examples(
    path: Path, schemas: dict[str, Schema], fields: Fields = SPIDER_FIELDS
) -> list[Example]:
    """A question file (Spider's train_spider.json, dev.json, ...; other formats by `fields`)
    as Examples.

    Every example must name a db_id that the schemas know and carry a non-empty question
    and query; anything else is an error naming the file and the index.
    """
    items = read_json(path)
    if not isinstance(items, list):
        raise SpiderDataError(f"{path}: expected a list of examples")
    examples = []
    for i, item in enumerate(items):
        where = f"{path.name} [{i}]"
        if not isinstance(item, dict):
            raise SpiderDataError(f"{path}: item {i} is not an object")
        missing = [k for k in ("db_id", fields.question, fields.query) if not item.get(k)]
        if missing:
            raise SpiderDataError(f"{path}: item {i} lacks {', '.join(missing)}")
        if item["db_id"] not in schemas:
            raise SpiderDataError(
                f"{path}: item {i} names db_id {item['db_id']!r}, which tables.json does not define"
            )
        text = {
            name: _clean_text(item[key], f"{path}: item {i} {key}")
            for name, key in (
                ("question", fields.question),
                ("query", fields.query),
                ("evidence", fields.evidence),
                ("difficulty", fields.difficulty),
            )
            if key is not None and item.get(key) is not None
        }
        examples.append(
            Example(
                item["db_id"],
                text["question"],
                text["query"],
                where,
                text.get("evidence", ""),
                text.get("difficulty"),
            )
        )
    return examples


def _clean_text(text: object, where: str) -> str:
    """NFC-normalised, stripped text; text that cannot be UTF-8 (lone surrogates) is an error."""
    if not isinstance(text, str):
        raise SpiderDataError(f"{where}: expected a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SpiderDataError(
            f"{where}: not valid Unicode text ({exc.reason} at position {exc.start})"
        ) from None
    return unicodedata.normalize("NFC", text).strip()


def database_path(spider_dir: Path, db_id: str) -> Path:
    """Where the release keeps `db_id`'s SQLite file (it may be absent: see the data card)."""
    return spider_dir / "database" / db_id / f"{db_id}.sqlite"
