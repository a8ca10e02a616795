"""Run untrusted SQL against Spider's SQLite files: read-only, bounded, and never raising.

Model output is untrusted text. Every query runs on a connection that cannot write, by three
independent locks: the `file:...?mode=ro&immutable=1` URI (SQLite opens the file read-only and
never creates journals or lock files), `PRAGMA query_only=1`, and an authorizer that allows
reading only (everything not on its allow-list is denied, so ATTACH, VACUUM INTO, writes,
schema changes, transactions and unlisted PRAGMAs fail at prepare time). SQLite's own limits
cap value sizes, SQL length and attached databases; a progress handler enforces wall time.

Every call returns a `Verdict`; nothing escapes as an exception. A database file that is absent
is a 'skipped' verdict, never an error, so callers count it instead of scoring it as wrong.

Known limit: the time limit is checked between VM instructions, so one call of a built-in
function that loops inside C without returning to the VM overruns it by that call's own
duration; the worst known is `printf('%.*c', 2147483647, 'x')`, about 6 s here. Value-size
limits keep every other such call (zeroblob, replace, instr on huge strings) short.
"""
from __future__ import annotations

import itertools
import math
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from sqlrl.paths import resolve

# Authorizer action codes that a read-only query needs. Everything else is denied.
_ALLOWED_ACTIONS = frozenset({
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,   # filtered by name below
    sqlite3.SQLITE_RECURSIVE,  # recursive CTEs; runaway ones are stopped by the time limit
    sqlite3.SQLITE_PRAGMA,     # filtered by name below
})
# Functions that reach outside the database (files, extensions, tokenizer pointers).
_DENIED_FUNCTIONS = frozenset({
    "load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "sqlite_dbpage",
})
# PRAGMAs that only describe the schema. Anything that sets or maintains something is denied.
_READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list",
})
STATUSES = ("ok", "error", "timeout", "skipped")
_FETCH_CHUNK = 512
_CACHE_KIB = 16_384


@dataclass(frozen=True)
class ExecLimits:
    """Bounds on one query. Defaults suit rewards; evaluation may raise `timeout_s`."""
    timeout_s: float = 5.0
    max_rows: int = 100_000               # Spider's largest gold results are a few thousand rows
    max_value_bytes: int = 100_000        # SQLITE_LIMIT_LENGTH (string, blob, row); Spider < 1 kB
    max_result_bytes: int = 64_000_000    # all fetched strings and blobs together
    max_sql_chars: int = 20_000           # model SQL is < 2k chars; this stops megabyte inputs
    progress_steps: int = 1_000           # VM instructions between wall-clock checks


@dataclass(frozen=True)
class Verdict:
    """The outcome of one query: ok with rows, or error/timeout/skipped with a reason."""
    status: str                           # one of STATUSES
    rows: tuple | None = None             # tuple of row tuples, only when ok
    columns: tuple | None = None          # column names, only when ok
    error: str = ""
    truncated: bool = False               # ok, but rows stop at the caller's `stop_after`

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _error(reason: str) -> Verdict:
    return Verdict("error", error=reason)


def _reason(exc: Exception) -> str:
    """A short reason for a refused or failed query."""
    text = str(exc)
    if "authoriz" in text:
        return f"refused: only reading queries may run ({text})"
    if "one statement at a time" in text:
        return "more than one statement"
    return f"{type(exc).__name__}: {text}"


def _absolute(db_path) -> str:
    """`db_path` as an absolute path string; relative paths are read against the repo root."""
    if isinstance(db_path, str) and os.path.isabs(db_path):
        return db_path  # the common case, without pathlib's cost
    return str(resolve(db_path))


def _text_bytes(rows: list[tuple]) -> int:
    """Characters and bytes of the text and blob values in `rows`."""
    return sum(len(v) for v in itertools.chain.from_iterable(rows)
               if v.__class__ is str or v.__class__ is bytes)


def _tolerant_text(data: bytes) -> str:
    """Decode text that is not valid UTF-8 (Latin-1 in some SQLite files) losslessly."""
    return data.decode("utf-8", errors="surrogateescape")


def _authorize(action, arg1, arg2, _db, _trigger) -> int:
    """SQLite authorizer: allow reading, deny everything else (see module docstring)."""
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() not in _READ_PRAGMAS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class _Deadline:
    """A progress handler that interrupts the running statement once its deadline passes."""

    def __init__(self):
        self.at = math.inf

    def __call__(self) -> int:
        return 1 if time.monotonic() > self.at else 0


class _Connection:
    """One read-only connection with its deadline, opened the safe way."""

    def __init__(self, db_path: str, limits: ExecLimits):
        uri = Path(db_path).resolve().as_uri() + "?mode=ro&immutable=1"
        self.conn = sqlite3.connect(uri, uri=True, isolation_level=None,
                                    check_same_thread=False)
        self.deadline = _Deadline()
        self.conn.execute("PRAGMA query_only=1")
        # Spider databases are a few MB: keep a whole one in this connection's page cache.
        self.conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 4 * limits.max_sql_chars)
        self.conn.set_authorizer(_authorize)
        self.conn.set_progress_handler(self.deadline, limits.progress_steps)

    def close(self):
        try:
            self.conn.close()
        except sqlite3.Error:
            pass


class SQLExecutor:
    """Executes queries with `limits`, reusing one connection per database (LRU).

    Gold results are cached per (database, SQL) in `execute_gold`. One instance per thread or
    process: connections are not shared across threads concurrently.
    """

    def __init__(self, limits: ExecLimits | None = None, max_connections: int = 256,
                 gold_cache_size: int = 20_000):
        self.limits = limits or ExecLimits()
        self.max_connections = max_connections
        self.gold_cache_size = gold_cache_size
        self._connections: OrderedDict[str, _Connection] = OrderedDict()
        self._gold: OrderedDict[tuple[str, str], Verdict] = OrderedDict()

    def execute(self, db_path: str | os.PathLike, sql: str,
                stop_after: int | None = None) -> Verdict:
        """Run one query; the result is always a Verdict, whatever `sql` contains.

        A relative `db_path` is read against the repo root, as every path the pipeline stores.
        With `stop_after`, at most that many rows are fetched; if there were more, the verdict
        is ok with `truncated` set (a comparison that already knows the answer stops early).
        """
        try:
            return self._execute(_absolute(db_path), sql, stop_after)
        except Exception as exc:  # last line of defence: a verdict, never an escape
            return _error(f"internal: {type(exc).__name__}: {exc}")

    def execute_gold(self, db_path: str | os.PathLike, sql: str) -> Verdict:
        """Like `execute`, cached per (database, SQL) since gold queries repeat across calls."""
        try:
            key = (_absolute(db_path), sql)
            hit = self._gold.get(key)
        except Exception as exc:  # an unusable path or unhashable SQL
            return _error(f"internal: {type(exc).__name__}: {exc}")
        if hit is not None:
            self._gold.move_to_end(key)
            return hit
        verdict = self.execute(*key)
        if verdict.status != "skipped":  # the file may appear later; don't remember its absence
            self._gold[key] = verdict
            if len(self._gold) > self.gold_cache_size:
                self._gold.popitem(last=False)
        return verdict

    def close(self):
        """Close every cached connection."""
        while self._connections:
            self._connections.popitem()[1].close()

    def _execute(self, db_path: str, sql, stop_after: int | None) -> Verdict:
        if not isinstance(sql, str):
            return _error(f"SQL is {type(sql).__name__}, not text")
        if not os.path.isfile(db_path):
            return Verdict("skipped", error=f"database absent: {db_path}")
        if len(sql) > self.limits.max_sql_chars:
            return _error(f"SQL is {len(sql)} characters, over the {self.limits.max_sql_chars} cap")
        if "\x00" in sql:
            return _error("SQL contains a NUL byte")
        if not sql.strip():
            return _error("empty SQL")
        try:
            conn = self._connection(db_path)
        except sqlite3.Error as exc:
            return _error(f"cannot open database: {exc}")
        start = time.monotonic()
        conn.deadline.at = start + self.limits.timeout_s
        try:
            try:
                return self._run(conn, sql, stop_after)
            except sqlite3.OperationalError as exc:
                if "decode" not in str(exc).lower():
                    raise
                conn.conn.text_factory = _tolerant_text  # rare: only for non-UTF-8 text
                try:
                    return self._run(conn, sql, stop_after)
                finally:
                    conn.conn.text_factory = str
        except sqlite3.OperationalError as exc:
            if time.monotonic() > conn.deadline.at or str(exc) == "interrupted":
                return Verdict("timeout", error=f"over the {self.limits.timeout_s:g} s limit")
            return _error(str(exc))
        except (sqlite3.Error, ValueError, OverflowError, MemoryError) as exc:
            return _error(_reason(exc))
        finally:
            conn.deadline.at = math.inf

    def _run(self, conn: _Connection, sql: str, stop_after: int | None) -> Verdict:
        """Execute and fetch within the caps; a cap breach is an error verdict."""
        cursor = conn.conn.cursor()
        try:
            cursor.execute(sql)
            if cursor.description is None:
                return _error("not a query: no statement, or one without a result set")
            columns = tuple(d[0] for d in cursor.description)
            # Below this many rows the result cannot exceed max_result_bytes: skip counting.
            uncounted = self.limits.max_result_bytes // (
                self.limits.max_value_bytes * max(1, len(columns)))
            rows: list[tuple] = []
            size = counted = 0
            wanted = math.inf if stop_after is None else max(0, stop_after) + 1
            while len(rows) < wanted:
                chunk = cursor.fetchmany(int(min(_FETCH_CHUNK, wanted - len(rows))))
                if not chunk:
                    break
                rows.extend(chunk)
                if len(rows) > self.limits.max_rows:
                    return _error(f"result has more than {self.limits.max_rows} rows")
                if len(rows) > uncounted:
                    size += _text_bytes(rows[counted:])
                    counted = len(rows)
                    if size > self.limits.max_result_bytes:
                        return _error(f"result is over {self.limits.max_result_bytes} bytes")
            if len(rows) >= wanted:
                return Verdict("ok", rows=tuple(rows[:stop_after]), columns=columns,
                               truncated=True)
            return Verdict("ok", rows=tuple(rows), columns=columns)
        finally:
            cursor.close()

    def _connection(self, db_path: str) -> _Connection:
        conn = self._connections.get(db_path)
        if conn is not None:
            self._connections.move_to_end(db_path)
            return conn
        conn = _Connection(db_path, self.limits)
        self._connections[db_path] = conn
        if len(self._connections) > self.max_connections:
            self._connections.popitem(last=False)[1].close()
        return conn


_local = threading.local()


def default_executor(limits: ExecLimits | None = None) -> SQLExecutor:
    """This thread's executor for `limits`, so plain `execute` calls reuse connections."""
    executors = getattr(_local, "executors", None)
    if executors is None:
        executors = _local.executors = {}
    limits = limits or ExecLimits()
    if limits not in executors:
        executors[limits] = SQLExecutor(limits)
    return executors[limits]


def execute(db_path: str | os.PathLike, sql: str, limits: ExecLimits | None = None) -> Verdict:
    """Run one query on `db_path` read-only and bounded; see `SQLExecutor.execute`."""
    return default_executor(limits).execute(db_path, sql)
