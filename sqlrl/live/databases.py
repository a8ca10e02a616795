"""Live databases by URL: what the server (`--database NAME=URL`) and `TextToSQL(database=URL)`
ask questions of, besides Spider's files. One registry by URL scheme (`SCHEMES`):

- `sqlite:///path/to/file.sqlite`: the file, run by the SQLite sandbox that runs every model
  answer (sqlrl/sql/executor.py: opened read-only and immutable, an authorizer that allows
  reading only, time, row and size bounds). The model writes SQLite: nothing is transpiled.
- `postgresql://user@host:port/dbname` (or `postgres://`): libpq's URL, through psycopg 3
  (the maintained PostgreSQL driver, binary wheels with libpq inside; SQLAlchemy would add a
  layer between us and the transaction settings the guarantee rests on, and nothing we need).
  The model's SQLite is transpiled by sqlglot to PostgreSQL (names matched to the database's
  own case-insensitively, as SQLite resolves them; LIKE as ILIKE, SQLite's LIKE being
  case-insensitive; a double-quoted word that names nothing as the string SQLite reads it
  as), checked against the refusal list (sqlrl/live/refusals.py), then run:
  * in a READ ONLY transaction (the connection's default too), rolled back after;
  * as a cursor (`DECLARE ... CURSOR FOR`): PostgreSQL takes only SELECT or VALUES there,
    over the extended protocol, which refuses a second statement;
  * with `statement_timeout` (and lock and idle timeouts) set for that transaction;
  * fetched `max_rows` + 1 rows at most, every value's memory counted against
    `max_result_bytes`.
  Numeric values come back as SQLite gives them (int, or float), so rows compare across the
  two engines.

Each database is introspected when connected and again on `refresh()`: its tables (those of
the connection's current schema the role may read), columns, types (as tables.json names
them: text, number, time, boolean, others), primary and foreign keys, and a few sample rows
per table, into the `sqlrl.data.spider.Schema` the one prompt builder serialises. The URL's
password is never logged or shown (`redact`); `describe()` is all a client sees.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from sqlrl.data.spider import Column, ForeignKey, Schema, Table
from sqlrl.errors import PipelineError
from sqlrl.live.refusals import Refused, check_query
from sqlrl.sql.executor import ExecLimits, Verdict, _python_bytes, default_executor

log = logging.getLogger("sqlrl.live")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_]{1,128}")  # as a Spider db_id
FETCH_CHUNK = 256


class LiveDatabaseError(PipelineError, ValueError):
    """A database URL that cannot be used; the message names it without its password."""


@dataclass(frozen=True)
class LiveLimits:
    """Bounds on every query of a live database (the server's --exec-timeout-s and
    --max-rows; the size cap is the sandbox's)."""

    timeout_s: float = 5.0
    max_rows: int = 100
    max_result_bytes: int = 64_000_000
    connect_timeout_s: int = 10


# --------------------------------------------------------------------------- URLs


def redact(url: str) -> str:
    """`url` without its password (`postgresql://me:***@host/db`): what logs and errors show."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def _scrubbed(text: str, url: str) -> str:
    """An error message with the URL's password taken out wherever it appears."""
    password = urlsplit(url).password
    for secret in {password, unquote(password or "")} - {None, ""}:
        text = text.replace(secret, "***")
    return text


def parse_named(arg: str) -> tuple[str, str]:
    """`NAME=URL` (a --database flag, a line of a --database-file) -> (name, url)."""
    name, sep, url = arg.strip().partition("=")
    name, url = name.strip(), url.strip()
    if not sep or not url:
        raise LiveDatabaseError(
            f"--database wants NAME=URL (e.g. shop=postgresql://reader@localhost/shop), "
            f"got {redact(arg.strip())[:200]!r}"
        )
    if not NAME_PATTERN.fullmatch(name):
        raise LiveDatabaseError(f"database name {name[:80]!r}: letters, digits and _ only")
    return name, url


def read_database_file(path: str | Path) -> list[tuple[str, str]]:
    """A --database-file: one NAME=URL a line; blank lines and # comments skipped. Keeps the
    passwords out of the process list, where a flag's value shows."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise LiveDatabaseError(f"--database-file {path}: {exc.strerror}") from None
    return [parse_named(line) for line in lines if line.strip() and not line.lstrip()[:1] == "#"]


def spider_type(declared: str) -> str:
    """tables.json's type (text, number, time, boolean, others) of a declared column type,
    by SQLite's affinity rules (which read PostgreSQL's type names the same way)."""
    t = (declared or "").upper()
    if "BOOL" in t:
        return "boolean"
    if "INT" in t or any(k in t for k in ("REAL", "FLOA", "DOUB", "NUM", "DEC")):
        return "number"
    if any(k in t for k in ("DATE", "TIME", "YEAR")):
        return "time"
    if any(k in t for k in ("CHAR", "CLOB", "TEXT", "UUID", "JSON")) or not t:
        return "text"
    return "others"


# --------------------------------------------------------------------------- databases


@dataclass
class LiveDatabase:
    """A database connected by URL: its schema and sample rows, and `run` for one query."""

    name: str
    url: str = field(repr=False)
    limits: LiveLimits = field(default_factory=LiveLimits)
    sample_rows: int = 0  # rows per table introspected for the prompt
    dialect: str = "sqlite"  # sqlglot's name of the database's dialect
    schema: Schema | None = None
    samples: dict[str, list[tuple]] = field(default_factory=dict)

    def __post_init__(self):
        self._lock = threading.Lock()

    def refresh(self) -> LiveDatabase:
        """Introspect again (tables added or changed since)."""
        schema, samples = self._introspect()
        if not schema.tables:
            raise LiveDatabaseError(
                f"database {self.name} ({redact(self.url)}) has no table this connection can read"
            )
        with self._lock:
            self.schema, self.samples = schema, samples
        log.info("live database %s (%s): %d tables", self.name, self.dialect, len(schema.tables))
        return self

    def rows_of(self, table: Table, n: int) -> list[tuple]:
        """A table's first `n` introspected rows (the prompt's sample rows)."""
        return self.samples.get(table.name, [])[:n]

    def describe(self) -> dict:
        """What a client may see: the name, the dialect, the tables (never the URL)."""
        return {
            "db_id": self.name,
            "dialect": self.dialect,
            "live": True,
            "present": True,
            "tables": [t.name for t in self.schema.tables],
        }

    def to_dialect(self, sql: str) -> str:
        """The model's SQLite as this database runs it (Refused when it may not run)."""
        return sql

    def run(self, sql: str, max_rows: int | None = None) -> Verdict:
        """One query, read-only and bounded: a Verdict whatever `sql` holds; `executed_sql`
        is what ran (the transpiled SQL), status `refused` for SQL stopped before it ran."""
        rows = self.limits.max_rows if max_rows is None else max_rows
        try:
            text = self.to_dialect(sql)
        except Refused as exc:
            return Verdict("refused", error=str(exc))
        verdict = self._execute(text, rows)
        return replace(verdict, executed_sql=text)

    def _introspect(self) -> tuple[Schema, dict[str, list[tuple]]]:
        raise NotImplementedError

    def _execute(self, sql: str, max_rows: int) -> Verdict:
        raise NotImplementedError


class SQLiteFile(LiveDatabase):
    """`sqlite:///path`: a SQLite file, run by the sandbox (sqlrl/sql/executor.py)."""

    @property
    def path(self) -> Path:
        parts = urlsplit(self.url)
        if parts.netloc not in ("", "localhost"):
            raise LiveDatabaseError(f"{redact(self.url)}: a sqlite URL names a local file")
        path = Path(unquote(parts.path))
        if not path.is_file():
            raise LiveDatabaseError(f"database {self.name}: no SQLite file at {path}")
        return path

    def _introspect(self):
        uri = self.path.resolve().as_uri() + "?mode=ro"
        try:
            con = sqlite3.connect(uri, uri=True)
        except sqlite3.Error as exc:
            raise LiveDatabaseError(f"database {self.name}: {exc}") from None
        con.text_factory = lambda b: b.decode("utf-8", errors="replace")
        try:
            names = [
                r[0]
                for r in con.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
                )
            ]
            tables, fks, samples = [], [], {}
            for name in names:
                info = con.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall()
                tables.append(
                    Table(name, tuple(Column(c[1], spider_type(c[2]), c[5] > 0) for c in info))
                )
                for fk in con.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,)):
                    if fk[4] is not None:  # REFERENCES t without a column: its primary key
                        fks.append(ForeignKey(name, fk[3], fk[2], fk[4]))
                if self.sample_rows:
                    quoted = '"' + name.replace('"', '""') + '"'
                    samples[name] = con.execute(
                        f"SELECT * FROM {quoted} LIMIT {int(self.sample_rows)}"
                    ).fetchall()
        except sqlite3.Error as exc:
            raise LiveDatabaseError(f"database {self.name}: {exc}") from None
        finally:
            con.close()
        return Schema(self.name, tuple(tables), tuple(fks)), samples

    def _execute(self, sql, max_rows):
        limits = ExecLimits(timeout_s=self.limits.timeout_s)
        return default_executor(limits).execute(self.path, sql, stop_after=max_rows)


class PostgresDatabase(LiveDatabase):
    """`postgresql://...`: PostgreSQL through psycopg 3, read-only by construction (above)."""

    def __post_init__(self):
        super().__post_init__()
        self.dialect = "postgres"

    def _connect(self):
        try:
            import psycopg
        except ImportError:
            raise LiveDatabaseError(
                "PostgreSQL databases need psycopg (pip install -r requirements.txt)"
            ) from None
        ms = max(1, int(self.limits.timeout_s * 1000))
        try:
            conn = psycopg.connect(
                self.url,
                connect_timeout=self.limits.connect_timeout_s,
                options=f"-c default_transaction_read_only=on -c statement_timeout={ms}",
                application_name="sqlrl",
            )
        except psycopg.Error as exc:
            raise LiveDatabaseError(
                f"database {self.name} ({redact(self.url)}): "
                + _scrubbed(str(exc).strip().splitlines()[0], self.url)
            ) from None
        conn.read_only = True  # every transaction: BEGIN READ ONLY
        conn.execute(
            "SELECT set_config('statement_timeout', %s, true), "
            "set_config('lock_timeout', %s, true), "
            "set_config('idle_in_transaction_session_timeout', %s, true)",
            (str(ms), str(ms), str(2 * ms)),
        )
        return conn

    def _introspect(self):
        conn = self._connect()
        try:
            relations = conn.execute(
                "SELECT c.oid, c.relname FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'v', 'm', 'p') "
                "AND has_table_privilege(c.oid, 'SELECT') ORDER BY c.oid"
            ).fetchall()
            names = dict(relations)
            tables, fks, samples = [], [], {}
            for oid, name in relations:
                columns = conn.execute(
                    "SELECT a.attname, format_type(a.atttypid, a.atttypmod), "
                    "coalesce(a.attnum = ANY(i.indkey), false) FROM pg_attribute a "
                    "LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
                    "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped "
                    "ORDER BY a.attnum",
                    (oid,),
                ).fetchall()
                tables.append(
                    Table(name, tuple(Column(c, spider_type(t), pk) for c, t, pk in columns))
                )
                for cols, ref_oid, ref_cols in conn.execute(
                    "SELECT (SELECT array_agg(attname ORDER BY k.i) FROM unnest(conkey) "
                    "WITH ORDINALITY k(n, i) JOIN pg_attribute ON attrelid = conrelid "
                    "AND attnum = k.n), confrelid, (SELECT array_agg(attname ORDER BY k.i) "
                    "FROM unnest(confkey) WITH ORDINALITY k(n, i) JOIN pg_attribute ON "
                    "attrelid = confrelid AND attnum = k.n) FROM pg_constraint "
                    "WHERE conrelid = %s AND contype = 'f' ORDER BY oid",
                    (oid,),
                ):
                    if ref_oid in names:
                        fks += [
                            ForeignKey(name, c, names[ref_oid], r)
                            for c, r in zip(cols, ref_cols, strict=True)
                        ]
                if self.sample_rows:
                    samples[name] = [
                        tuple(_sqlite_value(v) for v in row)
                        for row in conn.execute(
                            f"SELECT * FROM {_quote(name)} LIMIT {int(self.sample_rows)}"
                        ).fetchall()
                    ]
        except Exception as exc:
            raise LiveDatabaseError(
                f"database {self.name}: cannot read its schema: "
                + _scrubbed(str(exc).strip().splitlines()[0], self.url)
            ) from None
        finally:
            conn.close()
        return Schema(self.name, tuple(tables), tuple(fks)), samples

    def to_dialect(self, sql: str) -> str:
        return to_postgres(sql, self.schema)

    def _execute(self, sql: str, max_rows: int) -> Verdict:
        import psycopg
        from psycopg import errors

        try:
            conn = self._connect()
        except LiveDatabaseError as exc:
            return Verdict("error", error=f"cannot connect: {exc}")
        try:
            with conn.cursor(name="sqlrl_query") as cursor:
                cursor.execute(sql)
                columns = tuple(d.name for d in cursor.description or ())
                rows: list[tuple] = []
                size = 0
                while len(rows) <= max_rows:
                    chunk = cursor.fetchmany(min(FETCH_CHUNK, max_rows + 1 - len(rows)))
                    if not chunk:
                        break
                    chunk = [tuple(_sqlite_value(v) for v in row) for row in chunk]
                    size += _python_bytes(chunk)
                    if size > self.limits.max_result_bytes:
                        return Verdict(
                            "error", error=f"result is over {self.limits.max_result_bytes} bytes"
                        )
                    rows.extend(chunk)
            if len(rows) > max_rows:
                return Verdict("ok", rows=tuple(rows[:max_rows]), columns=columns, truncated=True)
            return Verdict("ok", rows=tuple(rows), columns=columns)
        except errors.QueryCanceled:
            return Verdict("timeout", error=f"over the {self.limits.timeout_s:g} s limit")
        except errors.ReadOnlySqlTransaction as exc:
            return Verdict("refused", error=f"refused by the read-only transaction: {_first(exc)}")
        except errors.InsufficientPrivilege as exc:
            return Verdict("refused", error=f"refused by the database's role: {_first(exc)}")
        except psycopg.Error as exc:
            return Verdict("error", error=_scrubbed(_first(exc), self.url))
        finally:
            try:
                conn.rollback()
            finally:
                conn.close()


def _first(exc: Exception) -> str:
    diag = getattr(exc, "diag", None)
    message = getattr(diag, "message_primary", None) or str(exc).strip().splitlines()[0]
    return message[:500]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlite_value(value):
    """A PostgreSQL value as SQLite would give it: numeric as int or float, dates as text."""
    from datetime import date, datetime, time
    from decimal import Decimal

    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    if isinstance(value, memoryview):
        return bytes(value)
    return value


# --------------------------------------------------------------------------- SQLite -> PG


class Untranspilable(Refused):
    """The model's SQL has no PostgreSQL form (or does not parse)."""


def to_postgres(sql: str, schema: Schema) -> str:
    """The model's SQLite query as PostgreSQL, checked: exactly one statement, names matched
    onto `schema`'s own (every identifier quoted as the database spells it), comments
    dropped (a comment is where a second statement hides), then parsed back as PostgreSQL
    will read it and checked against the refusal list. Refused (Untranspilable) otherwise."""
    from sqlglot.errors import ErrorLevel, SqlglotError

    tables = {t.name.lower() for t in schema.tables}
    tree = _one_query(sql, "sqlite", tables, "does not parse as SQLite")
    try:
        text = _sqlite_semantics(tree, schema).sql(
            dialect="postgres", identify=True, comments=False, unsupported_level=ErrorLevel.RAISE
        )
    except SqlglotError as exc:
        raise Untranspilable(f"does not transpile to PostgreSQL: {_line(exc)}") from None
    _one_query(text, "postgres", tables, "does not transpile to PostgreSQL")  # as PG reads it
    return text


def _line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


def _one_query(sql: str, dialect: str, tables: set[str], failure: str):
    """`sql`'s one statement, parsed in `dialect` and checked (sqlrl/live/refusals.py)."""
    import sqlglot
    from sqlglot.errors import SqlglotError

    try:
        trees = [t for t in sqlglot.parse(sql, read=dialect) if t is not None]
    except (SqlglotError, RecursionError) as exc:
        raise Untranspilable(f"{failure}: {_line(exc)}") from None
    if len(trees) != 1:
        raise Refused("one statement at a time" if trees else "no statement")
    check_query(trees[0], tables)
    return trees[0]


def _sqlite_semantics(tree, schema: Schema):
    """`tree` with SQLite's reading made explicit for PostgreSQL: names resolved without case
    onto the schema's spelling, aliases lower-cased, a double-quoted word that names no
    column a string, LIKE case-insensitive, a number compared with a text column compared as
    text (SQLite's affinity rule; a name that is numeric in any table is left alone), and an
    alias on each subquery in FROM (PostgreSQL before 16 wants one)."""
    from sqlglot import exp

    table_names = {t.name.lower(): t.name for t in schema.tables}
    column_names: dict[str, str] = {}
    for t in schema.tables:
        for c in t.columns:
            column_names.setdefault(c.name.lower(), c.name)
    aliases = {a.alias.lower() for a in tree.find_all(exp.Alias)}
    for column in list(tree.find_all(exp.Column)):
        ident = column.this
        if (
            isinstance(ident, exp.Identifier)
            and ident.quoted
            and not column.table
            and ident.name.lower() not in column_names
            and ident.name.lower() not in aliases
        ):
            column.replace(exp.Literal.string(ident.name))
    for ident in list(tree.find_all(exp.Identifier)):
        lower = ident.name.lower()
        parent = ident.parent
        names_a_table = (isinstance(parent, exp.Table) and parent.this is ident) or (
            isinstance(parent, exp.Column) and parent.args.get("table") is ident
        )
        first, second = (
            (table_names, column_names) if names_a_table else (column_names, table_names)
        )
        ident.set("this", first.get(lower) or second.get(lower) or lower)
    for like in list(tree.find_all(exp.Like)):
        like.replace(exp.ILike(this=like.this, expression=like.expression))
    # a number compared with a text column is compared as text (SQLite's affinity rule)
    non_text = {c.name.lower() for t in schema.tables for c in t.columns if c.type != "text"}
    text_columns = {c.name.lower() for t in schema.tables for c in t.columns} - non_text
    for comparison in list(tree.find_all(exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
        for side, other in (("this", "expression"), ("expression", "this")):
            column, literal = comparison.args.get(side), comparison.args.get(other)
            if (
                isinstance(column, exp.Column)
                and column.name.lower() in text_columns
                and isinstance(literal, exp.Literal)
                and not literal.is_string
            ):
                literal.replace(exp.Literal.string(literal.this))
    # PostgreSQL before 16 wants an alias on every subquery in FROM
    for i, sub in enumerate(list(tree.find_all(exp.Subquery))):
        if not sub.alias and isinstance(sub.parent, (exp.From, exp.Join)):
            sub.set("alias", exp.TableAlias(this=exp.to_identifier(f"subquery_{i}")))
    return tree


SCHEMES = {"sqlite": SQLiteFile, "postgresql": PostgresDatabase, "postgres": PostgresDatabase}


def connect(name: str, url: str, limits: LiveLimits | None = None, sample_rows: int = 0):
    """The database at `url` by its scheme (SCHEMES), introspected; LiveDatabaseError names
    what is wrong (never the password)."""
    if not NAME_PATTERN.fullmatch(name):
        raise LiveDatabaseError(f"database name {name[:80]!r}: letters, digits and _ only")
    scheme = urlsplit(url).scheme.lower().split("+")[0]
    kind = SCHEMES.get(scheme)
    if kind is None:
        raise LiveDatabaseError(
            f"database {name}: {redact(url)[:200]!r} is not a database URL this server reads "
            f"({', '.join(s + '://' for s in SCHEMES)})"
        )
    return kind(name, url, limits or LiveLimits(), sample_rows).refresh()


def name_of(url: str) -> str:
    """A name for a database given by URL alone (TextToSQL(database=URL)): the URL's
    database or file name, made a valid name."""
    parts = urlsplit(url)
    stem = Path(unquote(parts.path)).stem if parts.scheme == "sqlite" else parts.path.strip("/")
    return re.sub(r"[^A-Za-z0-9_]", "_", stem)[:128] or "database"
