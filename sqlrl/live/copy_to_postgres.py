"""Copy a SQLite database (a Spider one, or any) into PostgreSQL, as the live-database tests
load theirs and as anyone can try the server on a PostgreSQL copy of Spider:

    createdb concert_singer
    python -m sqlrl.live.copy_to_postgres \\
        data/raw/spider/database/concert_singer/concert_singer.sqlite \\
        postgresql://me@localhost/concert_singer

Tables keep their names and their columns' (quoted where PostgreSQL needs it, so the case is
kept). SQLite types are the values' own, not the declared ones, so each column gets the
PostgreSQL type its values fit: bigint when every value is an integer, double precision when
every one is a number, bytea for blobs, text otherwise; a key column (primary, or either end
of a foreign key) whose text values are all integers written out ('2') is bigint too, since
SQLite compares it as a number with the numeric key it joins (Spider stores some as text).
Rows go in by COPY. Primary and foreign keys are added where the data keeps them (foreign
keys NOT VALID: Spider's rows do not always honour them); each one refused is reported, not
fatal. The tables are created in the connection's current schema; a table that
is already there is an error unless `--replace`.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sqlrl.live.databases import LiveDatabaseError, _quote, redact


@dataclass
class CopyReport:
    """What a copy did: tables and rows copied, and the keys PostgreSQL refused (and why)."""

    tables: dict[str, int] = field(default_factory=dict)  # table -> rows
    skipped_keys: list[str] = field(default_factory=list)


def column_type(kinds: set[str], declared: str, integer_text: bool = False) -> str:
    """The PostgreSQL type of a column whose values are of SQLite's `kinds` (typeof());
    `integer_text`: its text values are all integers written out ('2'), which SQLite
    compares as numbers with a numeric column (a join key stored as text), so bigint."""
    kinds = kinds - {"null"}
    if not kinds:  # no values: the declared type's affinity decides
        upper = declared.upper()
        if "INT" in upper:
            return "bigint"
        if any(k in upper for k in ("REAL", "FLOA", "DOUB", "NUM", "DEC")):
            return "double precision"
        return "text"
    if kinds == {"integer"}:
        return "bigint"
    if kinds <= {"integer", "real"}:
        return "double precision"
    if kinds == {"blob"}:
        return "bytea"
    if kinds <= {"integer", "text"} and integer_text:
        return "bigint"
    return "text"


def _value(value, pg_type: str):
    """A SQLite value as the column's PostgreSQL type holds it."""
    if value is None:
        return None
    if pg_type == "text":
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        return str(value).replace("\x00", "")  # PostgreSQL text cannot hold NUL
    return value


def _key_columns(source: sqlite3.Connection, names: list[str]) -> set[tuple[str, str]]:
    """(table, column) of every primary key and both ends of every foreign key."""
    keys = set()
    for name in names:
        for c in source.execute("SELECT * FROM pragma_table_info(?)", (name,)):
            if c[5] > 0:
                keys.add((name.lower(), c[1].lower()))
        for fk in source.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,)):
            keys.add((name.lower(), fk[3].lower()))
            if fk[4] is not None:
                keys.add((fk[2].lower(), fk[4].lower()))
    return keys


def _column_type(source: sqlite3.Connection, table: str, column: str, declared: str, key: bool):
    q, t = _quote(column), _quote(table)
    kinds = {r[0] for r in source.execute(f"SELECT DISTINCT typeof({q}) FROM {t}")}
    integer_text = (
        key
        and "text" in kinds
        and not source.execute(
            f"SELECT 1 FROM {t} WHERE typeof({q}) = 'text' AND ({q} = '' OR "
            f"{q} GLOB '*[^0-9]*' AND NOT ({q} GLOB '-[0-9]*' AND substr({q}, 2) NOT GLOB "
            f"'*[^0-9]*') OR length({q}) > 18 OR ({q} GLOB '0?*')) LIMIT 1"
        ).fetchone()
    )
    return column_type(kinds, declared, integer_text)


def copy_database(sqlite_path: str | Path, conn, replace: bool = False) -> CopyReport:
    """Copy every table of `sqlite_path` into the psycopg connection `conn` (committed)."""
    source = sqlite3.connect(Path(sqlite_path).resolve().as_uri() + "?mode=ro", uri=True)
    source.text_factory = lambda b: b.decode("utf-8", errors="replace")
    report = CopyReport()
    try:
        names = [
            r[0]
            for r in source.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            )
        ]
        keys = []
        key_columns = _key_columns(source, names)
        for name in names:
            info = source.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall()
            types = [
                _column_type(
                    source, name, c[1], c[2] or "", (name.lower(), c[1].lower()) in key_columns
                )
                for c in info
            ]
            if replace:
                conn.execute(f"DROP TABLE IF EXISTS {_quote(name)} CASCADE")
            columns = ", ".join(f"{_quote(c[1])} {t}" for c, t in zip(info, types, strict=True))
            conn.execute(f"CREATE TABLE {_quote(name)} ({columns})")
            count = 0
            with conn.cursor().copy(f"COPY {_quote(name)} FROM STDIN") as copy:
                for row in source.execute(f"SELECT * FROM {_quote(name)}"):
                    copy.write_row([_value(v, t) for v, t in zip(row, types, strict=True)])
                    count += 1
            report.tables[name] = count
            primary = [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5] > 0]
            if primary:
                keys.append(
                    (
                        f"primary key of {name}",
                        f"ALTER TABLE {_quote(name)} ADD PRIMARY KEY "
                        f"({', '.join(map(_quote, primary))})",
                    )
                )
            for fk in source.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,)):
                if fk[4] is None:
                    continue
                keys.append(
                    (
                        f"foreign key {name}.{fk[3]} -> {fk[2]}.{fk[4]}",
                        f"ALTER TABLE {_quote(name)} ADD FOREIGN KEY ({_quote(fk[3])}) "
                        f"REFERENCES {_quote(fk[2])} ({_quote(fk[4])}) NOT VALID",
                    )
                )
        for what, statement in keys:  # after every table exists: references go forward too
            try:
                with conn.transaction():  # a savepoint: one refused key keeps the rest
                    conn.execute(statement)
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                first = getattr(getattr(exc, "diag", None), "message_primary", None) or str(exc)
                report.skipped_keys.append(f"{what}: {first.splitlines()[0]}")
        conn.commit()
    finally:
        source.close()
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.live.copy_to_postgres",
        description="Copy a SQLite database's tables and rows into PostgreSQL.",
    )
    parser.add_argument("sqlite", help="the SQLite file")
    parser.add_argument("url", help="postgresql://user@host/dbname (an existing database)")
    parser.add_argument("--replace", action="store_true", help="drop tables already there")
    args = parser.parse_args(argv)
    import psycopg

    if not Path(args.sqlite).is_file():
        print(f"copy_to_postgres: no SQLite file at {args.sqlite}", file=sys.stderr)
        return 2
    try:
        with psycopg.connect(args.url) as conn:
            report = copy_database(args.sqlite, conn, replace=args.replace)
    except (psycopg.Error, LiveDatabaseError) as exc:
        print(f"copy_to_postgres: {redact(args.url)}: {str(exc).strip()}", file=sys.stderr)
        return 1
    rows = sum(report.tables.values())
    print(f"copied {len(report.tables)} tables, {rows} rows to {redact(args.url)}")
    for skipped in report.skipped_keys:
        print(f"  not added: {skipped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
