"""A request's input, checked: what the server and the Python API (`TextToSQL`) must resolve
before a prompt can be built, so the Python API needs nothing of the HTTP package. The prompt
itself is built by sqlrl/data/prompts.py, the one prompt builder (the class that wrote the
training prompts, with the prompt settings saved with the model, sqlrl_prompt.json); this
module only says which schema a request names and why it cannot be used (`InputError`, with
the HTTP status to answer with).

Three ways a request names its schema:
- `schema_str`: schema text already serialised by the caller; used as it is.
- `db_id`: a database of the server's Spider directory (checked: a known name, its file
  present where the prompt reads sample rows); the schema comes from tables.json.
- `ddl`: CREATE TABLE statements, parsed with sqlglot into `sqlrl.data.spider.Schema` and
  serialised in the configured format, so a compact-format model sees `table | col, col | ...`
  as trained.

With `prepare.mark_schema_mentions`, the question gets the same "Schema mentions" suffix as in
training whenever a parsed schema is known (db_id, ddl); `schema_str` is opaque text and the
question stays as it is.

Schema-constrained decoding (docs/grammar.md) asks the same question of a request:
`RequestInput.grammar` gives the grammar of its parsed schema (db_id, ddl) from the backend's
`grammar_for`, or None with the reason it decodes unconstrained (a `schema_str` has no names
to constrain to; a schema that yields no grammar), and `check_constrained_format` refuses a
model whose answer format writes text around its query, as evaluation does.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import asdict
from pathlib import Path

from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.data.prompts import PromptFactory
from sqlrl.data.spider import (
    Column,
    ForeignKey,
    Schema,
    SpiderDataError,
    Table,
    database_path,
    load_schemas,
)
from sqlrl.formats import get_format

log = logging.getLogger("sqlrl.serve")
DB_ID_PATTERN = re.compile(r"[A-Za-z0-9_]{1,128}")
# why a schema_str request decodes unconstrained when constrained decoding is asked for
NO_PARSED_SCHEMA = (
    "schema_str is free text, with no parsed tables or columns to build a grammar from "
    "(give db_id or ddl to constrain)"
)


class InputError(ValueError):
    """The request cannot be served as given; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 422, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param  # the request field at fault, where one is


# --------------------------------------------------------------------------- DDL


class DDLError(InputError):
    """The `ddl` of a request cannot be used; the message says why."""

    def __init__(self, message: str):
        super().__init__(f"ddl: {message}", 422, "ddl")


def _spider_type(kind) -> str:
    """tables.json's column type (text, number, time, boolean, others) for a sqlglot type."""
    from sqlglot import exp

    if kind is None:
        return "text"
    t = kind.this
    if t in exp.DataType.TEXT_TYPES:
        return "text"
    if t in exp.DataType.NUMERIC_TYPES or t.name in ("REAL", "NUMBER"):
        return "number"
    if t in exp.DataType.TEMPORAL_TYPES or t.name == "YEAR":
        return "time"
    if t.name == "BOOLEAN":
        return "boolean"
    return "others"


def _name(node) -> str:
    from sqlglot import exp

    if isinstance(node, exp.Identifier):
        return node.this
    if isinstance(node, exp.Table):
        return node.name
    return node.name if hasattr(node, "name") else str(node)


@functools.lru_cache(maxsize=32)
def schema_from_ddl(ddl: str, db_id: str = "ddl") -> Schema:
    """CREATE TABLE statements -> Schema (names, types, primary and foreign keys).

    Statements other than CREATE TABLE (indexes, inserts) are ignored; no CREATE TABLE at all,
    text sqlglot cannot parse, or nesting deeper than its recursive parser goes, is an
    InputError naming the problem. Cached (the Schema is immutable): a request's prompt and its
    schema repair parse the DDL once, and a client resending its schema is not parsed again."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        statements = sqlglot.parse(ddl, read="sqlite")
    except SqlglotError as exc:
        raise DDLError(
            f"cannot parse the CREATE TABLE statements: {str(exc).splitlines()[0][:300]}"
        ) from None
    except RecursionError:
        raise DDLError("nested too deeply to parse") from None
    tables: list[Table] = []
    foreign_keys: list[ForeignKey] = []
    for stmt in statements:
        if not isinstance(stmt, exp.Create) or str(stmt.args.get("kind", "")).upper() != "TABLE":
            continue
        target = stmt.this
        if not isinstance(target, exp.Schema):  # CREATE TABLE ... AS SELECT: no column list
            raise DDLError(f"CREATE TABLE {_name(target)} has no column list")
        table_name = _name(target.this)
        columns: list[tuple[str, str, bool]] = []
        primary: set[str] = set()
        for item in target.expressions:
            if isinstance(item, exp.Identifier):  # a column without a type
                columns.append((item.this, "text", False))
            elif isinstance(item, exp.ColumnDef):
                name = item.name
                is_pk = False
                for constraint in item.args.get("constraints") or []:
                    kind = constraint.args.get("kind")
                    if isinstance(kind, exp.PrimaryKeyColumnConstraint):
                        is_pk = True
                    elif isinstance(kind, exp.Reference):
                        ref = kind.this
                        ref_cols = [_name(c) for c in getattr(ref, "expressions", [])]
                        foreign_keys.append(
                            ForeignKey(
                                table_name,
                                name,
                                _name(ref.this) if isinstance(ref, exp.Schema) else _name(ref),
                                ref_cols[0] if ref_cols else name,
                            )
                        )
                columns.append((name, _spider_type(item.args.get("kind")), is_pk))
            elif isinstance(item, exp.PrimaryKey):
                primary.update(
                    _name(c.this if isinstance(c, exp.Ordered) else c) for c in item.expressions
                )
            elif isinstance(item, exp.ForeignKey):
                ref = item.args.get("reference")
                if ref is None:
                    continue
                ref_schema = ref.this
                ref_table = _name(
                    ref_schema.this if isinstance(ref_schema, exp.Schema) else ref_schema
                )
                ref_cols = [_name(c) for c in getattr(ref_schema, "expressions", [])]
                for i, col in enumerate(item.expressions):
                    ref_col = ref_cols[i] if i < len(ref_cols) else _name(col)
                    foreign_keys.append(ForeignKey(table_name, _name(col), ref_table, ref_col))
        if not columns:
            raise DDLError(f"table {table_name!r} has no columns")
        tables.append(
            Table(table_name, tuple(Column(n, t, pk or n in primary) for n, t, pk in columns))
        )
    if not tables:
        raise DDLError("no CREATE TABLE statement found")
    return Schema(db_id, tuple(tables), tuple(foreign_keys))


# --------------------------------------------------------------------------- grammar


def check_constrained_format(rollout: str, setting: str) -> None:
    """ConstrainedFormatError (evaluation's) unless the answer format `rollout` is one the
    grammar covers (its answer template composed with the query grammar: `sql`, `reasoning`);
    `setting` names what asked for constrained decoding."""
    if get_format(rollout).grammar_constrained:
        return
    from sqlrl.eval.evaluate import ConstrainedFormatError

    raise ConstrainedFormatError(
        f"{setting}: the model answers in the {rollout!r} format, which writes text around its "
        "query; schema-constrained decoding covers a completion that is one query (the `sql` "
        "format) only (docs/grammar.md)"
    )


# --------------------------------------------------------------------------- prompts


class RequestInput:
    """A request's schema source checked against the Spider folder's databases, and its chat
    messages from the one prompt builder (`PromptFactory`), as prepare made the training
    prompts."""

    def __init__(
        self,
        settings: PromptSettings,
        spider_dir: str | Path | None,
        local: bool = False,
        live_schema_chars: int = 12_000,
    ):
        """local: errors are for the person who runs it (the Python API): they name the Spider
        folder and what is wrong with it. Otherwise (the server) they name no path: a client
        should not learn the server's files, and the detail goes to the server's log."""
        self.settings = settings
        self.spider_dir = Path(spider_dir) if spider_dir else None
        self.schemas: dict[str, Schema] = {}
        self.spider_error = ""
        owner = f"the Spider folder {self.spider_dir}" if local else "the server's Spider directory"
        self.where = {
            "tables": f"{owner}'s tables.json" if local else "the server's tables.json",
            "list": "TextToSQL(...).databases() lists them"
            if local
            else "GET /databases lists them",
            "files": owner,
        }
        if self.spider_dir is None:
            self.spider_error = (
                "no Spider folder was given"
                if local
                else ("the server has no Spider directory configured")
            )
        else:
            try:
                self.schemas = load_schemas(self.spider_dir / "tables.json")
            except SpiderDataError as exc:  # the detail names server paths: the log only
                log.error("serve: the Spider directory is unusable: %s", exc)
                self.spider_error = (
                    str(exc)
                    if local
                    else ("the server's Spider directory is unusable (see its log)")
                )
        self._factory = PromptFactory(settings, self.schemas, self.spider_dir)
        # databases connected by URL (sqlrl/live/databases.py), by name, beside Spider's
        self.live: dict = {}
        self.live_schema_chars = live_schema_chars

    def add_live(self, database) -> None:
        """A live database (sqlrl.live.databases.connect's), asked by its name as a db_id is."""
        from sqlrl.live.databases import LiveDatabaseError

        if database.name in self.schemas or database.name in self.live:
            raise LiveDatabaseError(
                f"database name {database.name!r} is taken (a Spider database, or another "
                "--database): name it otherwise"
            )
        self.live[database.name] = database

    # ------------------------------------------------------------------ databases
    def db_path(self, db_id: str) -> Path:
        return database_path(self.spider_dir, db_id)

    def check_db_id(self, db_id: str, need_file: bool):
        """The database file of a valid `db_id`, or the live database of that name (a 404
        naming it when unknown or absent)."""
        if not DB_ID_PATTERN.fullmatch(db_id):
            raise InputError(
                f"db_id {db_id[:80]!r} is not a database name (letters, digits and _ only)",
                param="db_id",
            )
        if db_id in self.live:
            return self.live[db_id]
        if not self.schemas:
            raise InputError(f"db_id {db_id!r} cannot be used: {self.spider_error}", 503, "db_id")
        if db_id not in self.schemas:
            raise InputError(
                f"unknown db_id {db_id!r}: not in {self.where['tables']} ({self.where['list']})",
                404,
                "db_id",
            )
        path = self.db_path(db_id)
        if need_file and not path.is_file():
            raise InputError(
                f"database {db_id!r} is in tables.json but its SQLite file is "
                f"absent from {self.where['files']}",
                404,
                "db_id",
            )
        return path

    def schema_of(self, db_id: str) -> dict:
        """The schema of database `db_id` as JSON (what a person writing SQL needs to see)."""
        live = self.check_db_id(db_id, need_file=False)
        schema = live.schema if db_id in self.live else self.schemas[db_id]
        return {
            "db_id": db_id,
            **({"dialect": live.dialect, "live": True} if db_id in self.live else {}),
            "tables": [
                {
                    "name": t.name,
                    "columns": [
                        {"name": c.name, "type": c.type, "primary_key": c.is_primary}
                        for c in t.columns
                    ],
                }
                for t in schema.tables
            ],
            "foreign_keys": [asdict(fk) for fk in schema.foreign_keys],
        }

    def databases(self) -> list[dict]:
        return [
            {
                "db_id": db_id,
                "present": self.db_path(db_id).is_file(),
                "tables": [t.name for t in schema.tables],
            }
            for db_id, schema in sorted(self.schemas.items())
        ] + [db.describe() for _, db in sorted(self.live.items())]

    def schema(self, *, db_id: str | None = None, ddl: str | None = None) -> Schema | None:
        """The schema of a request that names a database or gives DDL; None for schema_str
        (free text: there are no names to check a query against)."""
        if db_id is not None and db_id in self.schemas:
            return self.schemas[db_id]
        if db_id is not None and db_id in self.live:
            return self.live[db_id].schema
        if ddl is not None:
            try:
                return schema_from_ddl(ddl)
            except InputError:
                return None
        return None

    def grammar(
        self, grammar_for, *, db_id: str | None = None, ddl: str | None = None
    ) -> tuple[object | None, str | None]:
        """(grammar, None): the request's schema (db_id, ddl) through the backend's
        `grammar_for` (transformers: the compiled grammar; vLLM: the EBNF text); or (None, the
        reason it decodes unconstrained): a schema_str request, a schema that yields no
        grammar (GrammarUnavailable: a name SQL cannot write, xgrammar not installed), a
        backend without `grammar_for`. The reason is logged."""
        from sqlrl.sql.grammar import GrammarUnavailable

        schema = self.schema(db_id=db_id, ddl=ddl)
        if schema is None:
            return None, NO_PARSED_SCHEMA
        try:
            if grammar_for is None:
                raise GrammarUnavailable("the generation backend cannot decode under a grammar")
            # the format's answer around the query (reasoning: free thinking, then the query)
            return grammar_for(schema, get_format(self.settings.rollout).answer_grammar), None
        except GrammarUnavailable as exc:
            log.warning("no grammar for database %r, decoding unconstrained: %s", schema.db_id, exc)
            return None, str(exc)

    # ------------------------------------------------------------------ messages
    def messages(
        self,
        question: str,
        *,
        schema_str: str | None = None,
        db_id: str | None = None,
        ddl: str | None = None,
    ) -> list[dict]:
        """The request's chat messages from the one prompt builder, with the system prompt of
        the model's answer format (its Format's `prompt`, as training built its prompts)."""
        s = self.settings
        try:
            if db_id is not None and db_id in self.live:
                messages, _ = self.live_messages(db_id, question)
            elif db_id is not None:
                self.check_db_id(db_id, need_file=s.sample_rows > 0 and s.schema_format == "ddl")
                messages = self._factory.messages(db_id, question)
            elif ddl is not None:
                messages = self._factory.messages_for_schema(schema_from_ddl(ddl), question)
            else:
                messages = self._factory.messages_for_text(schema_str or "", question)
        except InputError:
            raise
        except ValueError as exc:  # the prompt builder's: empty question or schema
            raise InputError(str(exc)) from None
        return get_format(s.rollout).prompt(messages)

    def live_messages(self, db_id: str, question: str):
        """(the prompt's messages, the TableChoice) of a question on a live database."""
        db = self.live[db_id]
        return self._factory.messages_for_live(
            db.schema, db.rows_of, question, self.live_schema_chars
        )

    def table_choice(self, db_id: str | None, question: str):
        """Which tables a live database's prompt kept and why; None for other requests."""
        if db_id is None or db_id not in self.live:
            return None
        return self.live_messages(db_id, question)[1]
