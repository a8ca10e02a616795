"""Run untrusted SQL against Spider's SQLite files: read-only, bounded, and never raising.

Model output is untrusted text. Every query runs on a connection that cannot write, by three
independent locks: the `file:...?mode=ro&immutable=1` URI (SQLite opens the file read-only and
never creates journals or lock files), `PRAGMA query_only=1`, and an authorizer that allows
reading only (everything not on its allow-list is denied, so ATTACH, VACUUM INTO, writes,
schema changes, transactions and unlisted PRAGMAs fail at prepare time).

Bounds, each far above what Spider needs (gold: values <= 213 bytes, <= 19 result columns,
programs <= 131 VDBE ops, LIKE patterns <= 42 characters):

* Time: `timeout_s` plus a fraction of a second, whatever the SQL does. A progress handler
  stops the statement, but SQLite calls it only at loop ends and between rows, so one row's
  straight-line code runs unchecked. That code is bounded by SQLite's own limits on the
  connection: at most `max_program_ops` VDBE ops, each on values of at most
  `max_value_bytes` (SQLITE_LIMIT_LENGTH), which makes every linear built-in short. The
  built-ins that are not linear (LIKE and GLOB: pattern x text; replace, instr and 2-argument
  trims: text x text; printf's %c, which in SQLite 3.40 loops over its precision even past the
  length limit) are replaced by guards that check the deadline before each call, then run
  SQLite's own built-in on an in-memory connection with the same limits, so they give the
  same values and errors, a call at a time. One more step runs unchecked: sorting what a
  statement gathered for ORDER BY or GROUP BY, in memory; the heap limit bounds it (at
  64 MiB, about 2M rows: under 2 s past the deadline, measured on a loaded 2-core machine).
* Memory: under 256 MB per judged query. SQLite's heap (page caches, connections, sorts and
  temporary tables) stays under `max_heap_bytes` (PRAGMA hard_heap_limit, with the soft
  limit at half; both are process-wide, so concurrent queries in one process share them;
  64 MiB holds every Spider database's connection and cache with room to spare). Python's
  copy of the result is counted as it is fetched, every value type included, in chunks
  small enough that the worst case of the next chunk still fits in `max_result_bytes`
  (64 MB): it ends under that plus one row, and a row holds at most `max_columns` values
  of at most `max_value_bytes` each (8 MB as Python objects).
* Disk: none. Sorts and temporary tables stay in memory (PRAGMA temp_store=MEMORY, set by the
  sandbox; the authorizer denies every setting PRAGMA to the query itself).

Every call returns a `Verdict`; nothing escapes as an exception. A database file that is absent
is a 'skipped' verdict, never an error, so callers count it instead of scoring it as wrong.

Known limit: a guarded built-in gets its arguments through Python, so one given text that is
not valid UTF-8 (which no Spider database holds) makes the query an error.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import sqlite3
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

# Authorizer action codes that a read-only query needs. Everything else is denied.
_ALLOWED_ACTIONS = frozenset(
    {
        sqlite3.SQLITE_SELECT,
        sqlite3.SQLITE_READ,
        sqlite3.SQLITE_FUNCTION,  # filtered by name below
        sqlite3.SQLITE_RECURSIVE,  # recursive CTEs; runaway ones are stopped by the time limit
        sqlite3.SQLITE_PRAGMA,  # filtered by name below
    }
)
# Functions that reach outside the database (files, extensions, tokenizer pointers).
_DENIED_FUNCTIONS = frozenset(
    {
        "load_extension",
        "readfile",
        "writefile",
        "edit",
        "fts3_tokenizer",
        "sqlite_dbpage",
    }
)
# PRAGMAs that only describe the schema. Anything that sets or maintains something is denied.
_READ_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
    }
)
_FETCH_CHUNK = 512
_CACHE_KIB = 16_384
# Built-ins one call of which can run long (see the module docstring): name -> arities.
_GUARDED = {
    "like": (2, 3),
    "glob": (2,),
    "replace": (3,),
    "instr": (2,),
    "trim": (2,),
    "ltrim": (2,),
    "rtrim": (2,),
    "printf": (-1,),
    "format": (-1,),
}
# One printf conversion as SQLite 3.40 parses it: flags, width, .precision, l/ll, type.
_PRINTF_SPEC = re.compile(r"%([-+ #!0,]*)(\*|[1-9][0-9]*)?(?:\.(\*|[0-9]*))?(?:ll?)?(.?)", re.S)
_PRINTF_TAKES_ARG = frozenset("dsgzqQwcouxXfeEGipr")  # 'n' and '%' take none; others stop
_LEADING_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)")


@dataclass(frozen=True)
class ExecLimits:
    """Bounds on one query. Defaults suit rewards; evaluation may raise `timeout_s`."""

    timeout_s: float = 5.0
    max_rows: int = 100_000  # Spider's largest gold results are a few thousand rows
    max_value_bytes: int = 10_000  # SQLITE_LIMIT_LENGTH (string, blob, row); Spider 213
    max_result_bytes: int = 64_000_000  # Python's copy of the result, every value counted
    max_sql_chars: int = 10_000  # model SQL is < 2k chars; a statement over
    # max_value_bytes bytes is refused as too big too
    progress_steps: int = 1_000  # VM instructions between wall-clock checks
    max_columns: int = 200  # SQLITE_LIMIT_COLUMN; Spider: 26 per table, 19 per result
    max_program_ops: int = 10_000  # SQLITE_LIMIT_VDBE_OP; Spider's gold needs <= 131
    max_like_pattern: int = 1_000  # SQLITE_LIMIT_LIKE_PATTERN_LENGTH; Spider's <= 42
    max_heap_bytes: int = 64 * 2**20  # PRAGMA hard_heap_limit, process-wide (see above)

    def row_bytes(self, columns: int) -> int:
        """The most memory one fetched row of `columns` values can take in Python: a str of
        n UTF-8 bytes takes at most 4n bytes (one astral character makes every one 4 wide)."""
        return 56 + columns * (8 + 80 + 4 * self.max_value_bytes)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one query: ok with rows, or error/timeout/skipped with a reason."""

    status: str  # ok | error | timeout | skipped | refused (live databases, before it ran)
    rows: tuple | None = None  # tuple of row tuples, only when ok
    columns: tuple | None = None  # column names, only when ok
    error: str = ""
    truncated: bool = False  # ok, but rows stop at the caller's `stop_after`
    # a live database's (sqlrl/live/databases.py): the SQL it ran, transpiled to its dialect
    executed_sql: str | None = None

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
    """`db_path` as an absolute path string; relative paths are read against the working
    directory (the repo root, where DVC runs every stage)."""
    if isinstance(db_path, str) and os.path.isabs(db_path):
        return db_path  # the common case, without pathlib's cost
    return os.path.abspath(db_path)


def _python_bytes(rows: list[tuple]) -> int:
    """The memory `rows` take in Python: each row's tuple and each value (None is shared)."""
    return sum(map(sys.getsizeof, rows)) + sum(
        sys.getsizeof(v) for v in itertools.chain.from_iterable(rows) if v is not None
    )


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


def _set_limits(conn: sqlite3.Connection, limits: ExecLimits) -> None:
    """SQLite's own bounds on what one statement may hold (see the module docstring)."""
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 4 * limits.max_sql_chars)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, limits.max_columns)
    conn.setlimit(sqlite3.SQLITE_LIMIT_VDBE_OP, limits.max_program_ops)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, limits.max_like_pattern)
    # Process-wide, and a pragma can only lower it: set it the same on every connection.
    # Above the soft limit, page caches recycle their pages instead of growing, which keeps
    # the other half for the query itself.
    conn.execute(f"PRAGMA hard_heap_limit={int(limits.max_heap_bytes)}")
    conn.execute(f"PRAGMA soft_heap_limit={int(limits.max_heap_bytes) // 2}")
    conn.execute("PRAGMA temp_store=MEMORY")


def _int64(value) -> int:
    """sqlite3_value_int64 of a function argument: how printf reads a `*` width/precision."""
    if value.__class__ is int:
        return value
    if value.__class__ is float:
        if math.isnan(value):
            return 0
        return 2**63 - 1 if value >= 2.0**63 else -(2**63) if value <= -(2.0**63) else int(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    found = _LEADING_INT.match(value) if isinstance(value, str) else None
    if not found:
        return 0
    sign, digits = found.groups()
    magnitude = int(digits[-20:]) if len(digits.lstrip("0")) <= 20 else 2**64  # saturates
    return max(-(2**63), min(2**63 - 1, -magnitude if sign == "-" else magnitude))


def _printf_overflows(args: tuple, limit: int) -> bool:
    """Whether printf(*args) has a %c repeated more than `limit` times. Its result is then
    NULL (over SQLITE_LIMIT_LENGTH), but SQLite 3.40 loops over the whole precision to find
    that out: 2**31 loops take seconds in one call."""
    if not args or not isinstance(args[0], (str, bytes)):
        return False
    fmt = args[0].decode("utf-8", "replace") if isinstance(args[0], bytes) else args[0]
    next_arg = 1
    for spec in _PRINTF_SPEC.finditer(fmt):
        _flags, width, precision, kind = spec.groups()
        if kind == "%":
            continue
        next_arg += width == "*"
        repeat = 0
        if precision == "*":
            star = _int64(args[next_arg]) if next_arg < len(args) else 0
            star = (star + 2**31) % 2**32 - 2**31  # C's (int) cast
            repeat = -star if star < 0 else star
            next_arg += 1
        elif precision:
            repeat = int(precision) % 2**32 & 0x7FFFFFFF  # C's unsigned arithmetic
        if kind == "c" and repeat > limit:
            return True
        if kind not in _PRINTF_TAKES_ARG:
            if kind != "n":
                return False  # SQLite stops at an unknown type
            continue
        next_arg += 1
    return False


class _Guards:
    """Deadline-checked stand-ins for the built-ins in _GUARDED, on one connection.

    Each call checks the deadline, then runs SQLite's own built-in on `builtins`, an
    in-memory connection with the same limits (one an executor), so values and errors are
    SQLite's. The error a call raised is kept in `fault` (the statement itself only reports
    that a function failed).
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        deadline: _Deadline,
        limits: ExecLimits,
        builtins: sqlite3.Connection,
    ):
        self.deadline = deadline
        self.max_value_bytes = limits.max_value_bytes
        self.fault: Exception | None = None
        self.builtins = builtins
        for name, arities in _GUARDED.items():
            for arity in arities:
                conn.create_function(name, arity, self._stand_in(name), deterministic=True)

    def _stand_in(self, name: str):
        cursor, deadline = self.builtins.cursor(), self.deadline
        printf = name in ("printf", "format")
        sql: dict[int, str] = {}  # by argument count

        def call(*args):
            if time.monotonic() > deadline.at:
                raise TimeoutError(name)  # stops the statement; the caller sees the deadline
            try:
                if printf and _printf_overflows(args, self.max_value_bytes):
                    return None
                query = sql.get(len(args)) or sql.setdefault(
                    len(args), f"SELECT {name}({', '.join('?' * len(args))})"
                )
                return cursor.execute(query, args).fetchone()[0]
            except Exception as exc:
                self.fault = exc
                raise

        return call


class _Connection:
    """One read-only connection with its deadline, opened the safe way."""

    def __init__(self, db_path: str, limits: ExecLimits, builtins: sqlite3.Connection):
        uri = Path(db_path).resolve().as_uri() + "?mode=ro&immutable=1"
        # no statement cache: model SQL rarely repeats (gold results are cached as verdicts),
        # and 128 cached statements a database held SQLite's heap past its limit after a few
        # thousand queries, failing every later one as out of memory
        self.conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, check_same_thread=False, cached_statements=0
        )
        self.deadline = _Deadline()
        self.conn.execute("PRAGMA query_only=1")
        # Spider databases are a few MB: keep a whole one in this connection's page cache.
        self.conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        _set_limits(self.conn, limits)
        self.guards = _Guards(self.conn, self.deadline, limits, builtins)
        self.conn.set_authorizer(_authorize)
        self.conn.set_progress_handler(self.deadline, limits.progress_steps)

    def take_fault(self) -> Exception | None:
        """The error a guarded built-in raised in the last statement, if any."""
        fault, self.guards.fault = self.guards.fault, None
        return fault

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

    def __init__(
        self,
        limits: ExecLimits | None = None,
        max_connections: int = 256,
        gold_cache_size: int = 20_000,
    ):
        self.limits = limits or ExecLimits()
        self.max_connections = max_connections
        self.gold_cache_size = gold_cache_size
        self._connections: OrderedDict[str, _Connection] = OrderedDict()
        self._gold: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self._builtins: sqlite3.Connection | None = None  # runs the guarded built-ins

    def execute(
        self, db_path: str | os.PathLike, sql: str, stop_after: int | None = None
    ) -> Verdict:
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
        if self._builtins is not None:
            self._builtins.close()
            self._builtins = None

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
        conn.take_fault()
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
        except (sqlite3.Error, ValueError, OverflowError, MemoryError) as raised:
            return self._failure(conn.take_fault() or raised, conn)
        finally:
            conn.deadline.at = math.inf

    def _failure(self, exc: Exception, conn: _Connection) -> Verdict:
        """The verdict for a statement that raised `exc` (a guarded built-in's own error, if
        one raised it)."""
        if isinstance(exc, sqlite3.OperationalError):
            if time.monotonic() > conn.deadline.at or str(exc) == "interrupted":
                return Verdict("timeout", error=f"over the {self.limits.timeout_s:g} s limit")
            if "user-defined function" in str(exc):  # a guard never got its arguments
                return _error("a function argument is text that is not valid UTF-8")
            return _error(str(exc))
        if isinstance(exc, MemoryError):
            return _error("out of memory: over the SQLite heap or program-size limit")
        return _error(_reason(exc))

    def _run(self, conn: _Connection, sql: str, stop_after: int | None) -> Verdict:
        """Execute and fetch within the caps; a cap breach is an error verdict."""
        cursor = conn.conn.cursor()
        try:
            cursor.execute(sql)
            if cursor.description is None:
                return _error("not a query: no statement, or one without a result set")
            columns = tuple(d[0] for d in cursor.description)
            # Rows are fetched only while their worst case still fits in the budget; the rows
            # fetched so far are counted (every value) when it might not: memory stays under
            # max_result_bytes plus one row.
            budget, row_bytes = self.limits.max_result_bytes, self.limits.row_bytes(len(columns))
            rows: list[tuple] = []
            size = counted = 0  # the measured size of rows[:counted]
            wanted = math.inf if stop_after is None else max(0, stop_after) + 1
            while len(rows) < wanted:
                room = (budget - size) // row_bytes - (len(rows) - counted)
                if room < 1 and counted < len(rows):
                    size += _python_bytes(rows[counted:])
                    counted = len(rows)
                    if size > budget:
                        return _error(f"result is over {budget} bytes")
                    room = (budget - size) // row_bytes
                chunk = cursor.fetchmany(int(max(1, min(_FETCH_CHUNK, wanted - len(rows), room))))
                if not chunk:
                    break
                rows.extend(chunk)
                if len(rows) > self.limits.max_rows:
                    return _error(f"result has more than {self.limits.max_rows} rows")
            if len(rows) >= wanted:
                return Verdict("ok", rows=tuple(rows[:stop_after]), columns=columns, truncated=True)
            return Verdict("ok", rows=tuple(rows), columns=columns)
        finally:
            cursor.close()

    def _connection(self, db_path: str) -> _Connection:
        conn = self._connections.get(db_path)
        if conn is not None:
            self._connections.move_to_end(db_path)
            return conn
        if self._builtins is None:
            self._builtins = sqlite3.connect(
                ":memory:", isolation_level=None, check_same_thread=False
            )
            _set_limits(self._builtins, self.limits)
        conn = _Connection(db_path, self.limits, self._builtins)
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
