"""What a query may not do on a live PostgreSQL database, refused before it is sent.

The guarantee that a query cannot write is the connection (sqlrl/live/databases.py): a READ ONLY
transaction, opened by a role that should only hold SELECT (docs/serving.md gives its lines),
the query declared as a cursor (PostgreSQL accepts only SELECT or VALUES there, and the
extended protocol refuses a second statement). This module refuses what such a transaction
still allows, so that it never reaches the server:

- anything but one query: several statements, SET (it would lift the statement timeout), COPY
  (`TO PROGRAM` runs a shell command as the server), DO, CALL, and data-modifying WITH;
- SELECT ... INTO (creates a table) and FOR UPDATE / FOR SHARE (locks other sessions' rows);
- reading any table but the connected database's own (its introspected tables, and the
  query's own CTEs): the catalogs (pg_authid, pg_settings, pg_stat_activity: other sessions'
  queries), information_schema and other schemas are refused by name;
- functions that reach past the query's own rows (DENIED_FUNCTIONS, by pattern, each with its
  reason): files (pg_read_file, pg_ls_dir, lo_import), other servers (dblink), server state
  (pg_sleep, advisory locks, pg_terminate_backend, pg_notify, pg_logical_emit_message, which
  writes WAL even in a read-only transaction), settings (set_config, current_setting), SQL
  run from a string (query_to_xml), and values built huge in the server's memory (repeat,
  lpad, rpad: SQLite has none of them, so a model's SQLite query never needs them).

The list denies by pattern, so `pg_` covers every administration function (pg_typeof too, the
one harmless casualty: SQLite's typeof is transpiled to it). What stays allowed is bounded by
the connection: a statement timeout, a row cap and a result-size cap (a cross join of the
largest tables returns its first rows, or times out when it must sort them all).
"""

from __future__ import annotations

import re

from sqlglot import exp

# (pattern on a lower-cased function name, why it is refused)
DENIED_FUNCTIONS: tuple[tuple[str, str], ...] = (
    (r"pg_.*", "a server administration function (files, sleep, locks, signals, WAL, settings)"),
    (r"lo_.*|loread|lowrite", "large objects: files on the server, and storage outside tables"),
    (r"dblink.*", "a connection to another database"),
    (r"set_config|current_setting", "reads or changes the server's settings"),
    (r"(query|cursor|table|schema|database)_to_xml.*", "runs SQL given as a string"),
    (r"txid_.*|nextval|setval|currval", "transaction ids and sequences: server state"),
    (r"repeat|lpad|rpad", "builds values as large as the server's memory allows"),
    (r"inet_server_.*|inet_client_.*|version", "tells the server's address or version"),
)
_DENIED = [(re.compile(pattern), why) for pattern, why in DENIED_FUNCTIONS]
# nodes that make a statement something other than a plain query, wherever they occur
_NOT_READING = tuple(
    getattr(exp, name)
    for name in (
        "Insert",
        "Update",
        "Delete",
        "Merge",
        "Create",
        "Drop",
        "Alter",
        "Command",
        "Copy",
        "Set",
        "Into",
        "Lock",
        "Transaction",
        "Commit",
        "Rollback",
        "Pragma",
        "Use",
        "Grant",
        "Revoke",
    )
    if hasattr(exp, name)
)


class Refused(ValueError):
    """A query refused before execution; the message says what and why."""


def function_name(node: exp.Func) -> str:
    """A function call's name as the database sees it, lower-cased."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    return node.sql_name().lower()


def denied_function(name: str) -> str | None:
    """Why the function `name` is refused, or None when it may run."""
    for pattern, why in _DENIED:
        if pattern.fullmatch(name.lower()):
            return why
    return None


def check_query(tree: exp.Expression, tables: set[str]) -> None:
    """Refused unless `tree` is one reading query over `tables` (lower-cased names) and its
    own CTEs, calling no denied function."""
    if not isinstance(tree, exp.Query):
        raise Refused(f"only a query may run, not {tree.key.upper()}")
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for node in tree.walk():
        if isinstance(node, _NOT_READING):
            what = "SELECT ... INTO" if isinstance(node, exp.Into) else node.key.upper()
            raise Refused(f"{what} is not a reading query")
        if isinstance(node, exp.Func):
            name = function_name(node)
            why = denied_function(name)
            if why:
                raise Refused(f"function {name}() is refused: {why}")
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            name = node.name.lower()
            qualified = bool(node.args.get("db") or node.args.get("catalog"))
            if qualified or (name not in tables and name not in ctes):
                shown = ".".join(p.name for p in node.parts)
                raise Refused(f"table {shown} is not one of the connected database's tables")
