"""The one prompt builder. SFT, GRPO, evaluation and serving all call it, so the prompt a model
is trained on is byte for byte the prompt it is served with (a request's schema, whichever way
it is given, is checked by sqlrl/request_input.py and then built here: `PromptFactory`).

A prompt is a list of chat messages (system + user); the tokenizer's chat template renders it.
Two schema serialisations, chosen by `prepare.schema_format`:
- compact: `table | col, col | table | col` (short: fits small models and short contexts);
- ddl: CREATE TABLE statements with types, primary and foreign keys, optionally followed by N
  sample rows per table read from the database (what Qwen2.5-Coder and OmniSQL are used to).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlrl.data.augment import mark_question
from sqlrl.data.descriptions import read_descriptions
from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.data.spider import PLAIN_IDENTIFIER, Column, Schema, Table, database_path
from sqlrl.sql.extract import normalize_sql_whitespace  # SFT's targets; the formats' too

SAMPLE_VALUE_CHARS = 40


def quote_identifier(name: str) -> str:
    """Leave plain names alone; double-quote the rest (spaces, punctuation) the SQLite way."""
    if PLAIN_IDENTIFIER.fullmatch(name):
        return name
    return '"' + name.replace('"', '""') + '"'


Notes = dict[str, dict[str, str]]  # table -> column -> description, names lower-cased


def _note(notes: Notes | None, table: Table, column: Column) -> str:
    """The description of a column (sqlrl/data/descriptions.py), "" without one."""
    return (notes or {}).get(table.name.lower(), {}).get(column.name.lower(), "")


def compact_schema(schema: Schema, notes: Notes | None = None) -> str:
    """`table | col, col | table | col`: one line, tables in schema order; with `notes`, a
    described column reads `col (what it holds)`."""
    parts = []
    for table in schema.tables:
        parts.append(table.name)
        names = []
        for col in table.columns:
            note = _note(notes, table, col)
            names.append(f"{col.name} ({note})" if note else col.name)
        parts.append(", ".join(names))
    return " | ".join(parts)


RowsOf = Callable[[Table, int], list[tuple]]  # a table's first n rows (a live database's)


def ddl_schema(
    schema: Schema,
    db_path: Path | None = None,
    sample_rows: int = 0,
    notes: Notes | None = None,
    rows_of: RowsOf | None = None,
) -> str:
    """CREATE TABLE statements; with `sample_rows` > 0, that many rows per table as comments
    (read from `db_path`, or given by `rows_of`: a live database's introspected rows); with
    `notes`, each described column's line ends in an SQL comment saying what it holds."""
    blocks = []
    for table in schema.tables:
        block = _create_table(schema, table, notes)
        if sample_rows > 0:
            if rows_of is None and db_path is None:
                raise ValueError(f"{schema.db_id}: sample rows need the database file")
            rows = (rows_of or (lambda t, n: _read_rows(db_path, t, n)))(table, sample_rows)
            block += "\n" + _rows_comment(table, rows)
        blocks.append(block)
    return "\n\n".join(blocks)


def _create_table(schema: Schema, table: Table, notes: Notes | None = None) -> str:
    lines = [f"  {quote_identifier(c.name)} {c.type.upper()}" for c in table.columns]
    keys = [quote_identifier(c.name) for c in table.columns if c.is_primary]
    if keys:
        lines.append(f"  PRIMARY KEY ({', '.join(keys)})")
    for fk in schema.foreign_keys:
        if fk.table == table.name:
            lines.append(
                f"  FOREIGN KEY ({quote_identifier(fk.column)}) REFERENCES "
                f"{quote_identifier(fk.ref_table)}({quote_identifier(fk.ref_column)})"
            )
    comments = [_note(notes, table, c) for c in table.columns] + [""] * (
        len(lines) - len(table.columns)
    )
    if any(comments):  # the comma before the comment, or the comment would swallow it
        body = "\n".join(
            line + ("," if i < len(lines) - 1 else "") + (f" -- {note}" if note else "")
            for i, (line, note) in enumerate(zip(lines, comments, strict=True))
        )
    else:
        body = ",\n".join(lines)
    return f"CREATE TABLE {quote_identifier(table.name)} (\n" + body + "\n);"


def _read_rows(db_path: Path, table: Table, n: int) -> list[tuple]:
    """The first `n` rows of `table` in the SQLite file `db_path`."""
    uri = f"file:{Path(db_path).resolve()}?mode=ro"
    con = sqlite3.connect(uri, uri=True)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")
    try:
        rows = con.execute(f"SELECT * FROM {quote_identifier(table.name)} LIMIT {int(n)}")
        return rows.fetchall()
    finally:
        con.close()


def _rows_comment(table: Table, rows: list[tuple]) -> str:
    """Rows of `table`, values shortened, as an SQL comment."""
    rendered = [", ".join(_short_value(v) for v in row) for row in rows]
    header = f"/* {len(rows)} example rows from {table.name}:"
    return "\n".join([header, *rendered]) + " */"


def _short_value(value: object) -> str:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= SAMPLE_VALUE_CHARS else text[: SAMPLE_VALUE_CHARS - 3] + "..."


def serialize_schema(
    schema: Schema,
    schema_format: str,
    db_path: Path | None = None,
    sample_rows: int = 0,
    notes: Notes | None = None,
    rows_of: RowsOf | None = None,
) -> str:
    """The schema text for a prompt, in the format `prepare.schema_format` names, with the
    column descriptions in `notes` (prepare.column_descriptions) where given."""
    if schema_format == "compact":
        return compact_schema(schema, notes)
    if schema_format == "ddl":
        return ddl_schema(schema, db_path, sample_rows, notes, rows_of)
    raise ValueError(f"unknown schema format {schema_format!r} (use 'compact' or 'ddl')")


def build_messages(
    schema_text: str, question: str, system_prompt: str, evidence: str = ""
) -> list[dict]:
    """The chat messages for one question: the system prompt, then schema, evidence (BIRD's
    external knowledge, where a question has it) and question."""
    question = " ".join(question.split())
    if not question:
        raise ValueError("the question is empty")
    if not schema_text.strip():
        raise ValueError("the schema is empty")
    evidence = " ".join(evidence.split())
    hint = f"Evidence: {evidence}\n" if evidence else ""
    user = f"Database schema:\n{schema_text}\n\n{hint}Question: {question}"
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]


def completion_message(sql: str) -> list[dict]:
    """The assistant turn for SFT: the gold SQL with Spider's stray whitespace collapsed."""
    return [{"role": "assistant", "content": normalize_sql_whitespace(sql)}]


def render_prompt(tokenizer, messages: list[dict]) -> str:
    """The prompt text a model sees: the tokenizer's chat template plus the assistant header."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@dataclass
class PromptFactory:
    """Builds prompts from prompt settings: what prepare writes for training and evaluation,
    and what the server and TextToSQL send; each database's schema is serialised once.

    With `max_prompt_tokens`, a DDL schema whose prompt would not fit gets fewer sample rows
    (down to none), decided per database so training, evaluation and serving agree; the
    question gets QUESTION_TOKENS of the budget. `sample_rows_used` records the reductions.
    """

    settings: PromptSettings
    schemas: dict[str, Schema]
    spider_dir: Path | None  # the databases, for DDL sample rows
    # db_id -> its SQLite file, for sets whose databases are not laid out as Spider's
    locate: Callable[[str], Path] | None = None

    def __post_init__(self):
        self._schema_text: dict[str, str] = {}
        self.sample_rows_used: dict[str, int] = {}  # db_id -> rows, where fewer than asked

    def messages(self, db_id: str, question: str, evidence: str = "") -> list[dict]:
        """The prompt for a question on one of `schemas`' databases."""
        return self._messages(self.schemas[db_id], self.schema_text(db_id), question, evidence)

    def messages_for_schema(self, schema: Schema, question: str) -> list[dict]:
        """The prompt for a question on a schema without a database (no sample rows)."""
        text = serialize_schema(schema, self.settings.schema_format)
        return self._messages(schema, text, question)

    def messages_for_live(
        self, schema: Schema, rows_of: RowsOf, question: str, budget_chars: int
    ) -> tuple[list[dict], TableChoice]:
        """The prompt for a question on a live database (sqlrl/live/databases.py): its introspected
        schema and sample rows serialised as training serialised Spider's, the tables cut to
        `budget_chars` of schema text by `choose_tables` (which it reports)."""
        p = self.settings
        rows = p.sample_rows if p.schema_format == "ddl" else 0

        def text(tables) -> str:
            kept = {t.name for t in tables}
            fks = tuple(fk for fk in schema.foreign_keys if {fk.table, fk.ref_table} <= kept)
            part = Schema(schema.db_id, tuple(tables), fks)
            return serialize_schema(part, p.schema_format, sample_rows=rows, rows_of=rows_of)

        choice = choose_tables(schema, question, lambda t: len(text([t])) + 3, budget_chars)
        kept = [t for t in schema.tables if t.name in choice.kept]
        return self._messages(schema, text(kept), question), choice

    def messages_for_text(self, schema_text: str, question: str) -> list[dict]:
        """The prompt for a question on schema text given as it is (a request's schema_str):
        opaque text, so no schema mentions are marked."""
        return build_messages(schema_text, question, self.settings.system_prompt)

    def _messages(
        self, schema: Schema, schema_text: str, question: str, evidence: str = ""
    ) -> list[dict]:
        if self.settings.mark_schema_mentions:
            question = mark_question(question, schema)
        return build_messages(schema_text, question, self.settings.system_prompt, evidence)

    def schema_text(self, db_id: str) -> str:
        if db_id not in self._schema_text:
            self._schema_text[db_id] = self._fitting_schema(db_id)
        return self._schema_text[db_id]

    def _fitting_schema(self, db_id: str) -> str:
        schema = self.schemas[db_id]
        db_path = self.locate(db_id) if self.locate else database_path(self.spider_dir, db_id)
        p = self.settings
        rows = p.sample_rows if p.schema_format == "ddl" else 0
        notes = read_descriptions(db_path.parent) if p.column_descriptions and db_path else None
        while True:
            text = serialize_schema(schema, p.schema_format, db_path, rows, notes)
            if (
                rows == 0
                or p.max_prompt_tokens == 0
                or prompt_tokens(text, p.system_prompt) + QUESTION_TOKENS <= p.max_prompt_tokens
            ):
                break
            rows -= 1
        if rows < p.sample_rows and p.schema_format == "ddl":
            self.sample_rows_used[db_id] = rows
        return text


@dataclass(frozen=True)
class TableChoice:
    """Which tables of a live database's schema a prompt keeps, and why (shown to the user)."""

    kept: tuple[str, ...]
    dropped: tuple[str, ...] = ()
    why: str = ""


def _words(text: str) -> set[str]:
    """Lower-cased words of `text` (names split at _ and case changes) of three letters or
    more, plural s dropped."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    words = re.findall(r"[a-z0-9]{3,}", text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words}


def choose_tables(
    schema: Schema, question: str, size_of: Callable[[Table], int], budget_chars: int
) -> TableChoice:
    """Every table when the schema's text fits `budget_chars` (0: no limit); otherwise, in
    this order while they fit: the tables whose name the question has (those with more of
    its words in their name, then in their columns, first), the tables their foreign keys
    join, the tables with a column the question names, then the rest in the database's
    order. Kept tables stay in the database's order."""
    sizes = {t.name: size_of(t) for t in schema.tables}
    if not budget_chars or sum(sizes.values()) <= budget_chars:
        return TableChoice(tuple(sizes))
    asked = _words(question)

    def score(table: Table) -> tuple[int, int]:
        columns = set().union(*(_words(c.name) for c in table.columns))
        return (len(_words(table.name) & asked), len(columns & asked))

    ranked = sorted(schema.tables, key=score, reverse=True)
    named = [t.name for t in ranked if score(t)[0]]
    joined = [
        other
        for fk in schema.foreign_keys
        for a, other in ((fk.table, fk.ref_table), (fk.ref_table, fk.table))
        if a in named
    ]
    by_column = [t.name for t in ranked if score(t)[1]]
    order = list(dict.fromkeys([*named, *joined, *by_column, *sizes]))
    kept, used = set(), 0
    for name in order:
        if used + sizes[name] <= budget_chars:
            kept.add(name)
            used += sizes[name]
    return TableChoice(
        tuple(n for n in sizes if n in kept),
        tuple(n for n in sizes if n not in kept),
        f"the schema is {sum(sizes.values())} characters, over the prompt's budget of "
        f"{budget_chars}: kept first the tables the question names ({', '.join(named) or 'none'}),"
        " then those their foreign keys join, those with a column it names, then the rest",
    )


QUESTION_TOKENS = 128  # budget kept for the question (Spider's longest is about 60 tokens)


def prompt_tokens(schema_text: str, system_prompt: str, question: str = "") -> int:
    """Tokens of the rendered chat prompt (with the assistant header), by Qwen2.5's tokenizer:
    the reference model's, available offline (sqlrl/model/qwen_tokenizer.py)."""
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    messages = build_messages(schema_text, question or "?", system_prompt)
    return len(
        build_qwen25_tokenizer().apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=True
        )["input_ids"]
    )
