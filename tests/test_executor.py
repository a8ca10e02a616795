"""The executor: read-only, bounded, a verdict for everything, and the file system untouched."""
from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from sqlrl.executor import ExecLimits, SQLExecutor, Verdict, execute
from sqlrl.paths import REPO_ROOT

RUNAWAY = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
CARTESIAN = ("SELECT count(*) FROM singer a, singer b, singer c, singer d, singer e, singer f, "
             "singer g, singer h, singer i, singer j, singer k")


@pytest.fixture
def db(spider_dir, tmp_path) -> Path:
    """A private copy of concert_singer, alone in its directory."""
    folder = tmp_path / "db"
    folder.mkdir()
    target = folder / "concert_singer.sqlite"
    shutil.copyfile(spider_dir / "database" / "concert_singer" / "concert_singer.sqlite", target)
    return target


def snapshot(folder: Path) -> dict:
    """Every file under `folder` with its bytes and modification time."""
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_query_gives_its_rows_and_columns(db):
    verdict = execute(db, "SELECT name, age FROM singer WHERE age > 40 ORDER BY age")
    assert verdict == Verdict("ok", rows=(("Rose White", 41), ("John Nizinik", 43),
                                          ("Joe Sharp", 52)), columns=("Name", "Age"))
    assert verdict.ok


def test_trailing_semicolons_and_comments_are_fine(db):
    for sql in ["SELECT count(*) FROM singer;", "SELECT count(*) FROM singer; -- done",
                "/* count */ SELECT count(*) FROM singer /* all */ ;",
                "SELECT count(*) -- how many\nFROM singer"]:
        assert execute(db, sql).rows == ((6,),), sql


def test_relative_paths_are_read_against_the_repo_root(spider_dir):
    relative = (spider_dir / "database" / "concert_singer" / "concert_singer.sqlite") \
        .relative_to(REPO_ROOT)
    assert execute(relative, "SELECT count(*) FROM singer").rows == ((6,),)


def test_an_absent_database_is_skipped_and_not_created(tmp_path):
    missing = tmp_path / "wta_1" / "wta_1.sqlite"
    verdict = execute(missing, "SELECT 1")
    assert verdict.status == "skipped" and "absent" in verdict.error
    assert not missing.exists() and list(tmp_path.iterdir()) == []


def test_schema_reading_pragmas_are_allowed(db):
    verdict = execute(db, "PRAGMA table_info(singer)")
    assert verdict.ok and len(verdict.rows) == 7


BAD_SQL = {
    "garbage": "hello world",
    "empty": "",
    "blank": "   \n ",
    "comment only": "-- nothing here",
    "non-sql prose": "The singers are Joe and Rose.",
    "syntax error": "SELEC name FRM singer",
    "unknown table": "SELECT * FROM nowhere",
    "insert": "INSERT INTO singer (Singer_ID, Name) VALUES (99, 'x')",
    "update": "UPDATE singer SET age = 0",
    "delete": "DELETE FROM singer",
    "drop": "DROP TABLE singer",
    "create": "CREATE TABLE t (x int)",
    "create temp": "CREATE TEMP TABLE t AS SELECT * FROM singer",
    "create view": "CREATE VIEW v AS SELECT 1",
    "alter": "ALTER TABLE singer ADD COLUMN x int",
    "stacked select": "SELECT 1; SELECT 2",
    "stacked write": "SELECT 1; DELETE FROM singer",
    "doubled semicolon": "SELECT 1;;",
    "attach": "ATTACH 'x.db' AS x",
    "attach memory": "ATTACH ':memory:' AS m",
    "detach": "DETACH main",
    "pragma write": "PRAGMA query_only = 0",
    "pragma journal": "PRAGMA journal_mode = WAL",
    "pragma writable schema": "PRAGMA writable_schema = 1",
    "pragma read of a setting": "PRAGMA query_only",
    "vacuum": "VACUUM",
    "vacuum into": "VACUUM INTO 'copy.db'",
    "begin": "BEGIN",
    "savepoint": "SAVEPOINT s",
    "analyze": "ANALYZE",
    "reindex": "REINDEX",
    "load_extension": "SELECT load_extension('libevil')",
    "fts3_tokenizer": "SELECT fts3_tokenizer('simple')",
    "nul byte": "SELECT 1\x00; DROP TABLE singer",
    "megabyte sql": "SELECT " + "1 + " * 250_000 + "1",
    "deep nesting": "SELECT " + "(" * 5_000 + "1" + ")" * 5_000,
    "deep subqueries": "SELECT " + "(SELECT " * 1_500 + "1" + ")" * 1_500,
    "huge blob": "SELECT zeroblob(2e9)",
    "huge string": "SELECT replace(hex(zeroblob(60000)), '0', '00')",
    "too many rows": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r "
                     "WHERE i < 200000) SELECT i FROM r",
}


@pytest.mark.parametrize("name", BAD_SQL)
def test_bad_sql_is_a_verdict_with_a_reason_and_changes_nothing(db, name, tmp_path,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)  # where relative names like 'x.db' would land
    folder = db.parent
    before = snapshot(folder)
    cwd_before = sorted(os.listdir())
    start = time.monotonic()
    verdict = SQLExecutor(ExecLimits(timeout_s=1.0)).execute(db, BAD_SQL[name])
    assert verdict.status in ("error", "timeout"), verdict
    assert verdict.error and verdict.rows is None
    assert time.monotonic() - start < 5.0
    assert snapshot(folder) == before
    assert sorted(os.listdir()) == cwd_before  # relative file names did not land in the cwd


def test_attach_and_vacuum_into_create_no_file_anywhere(db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    executor = SQLExecutor()
    for target in [tmp_path / "x.db", db.parent / "y.db", Path("z.db")]:
        assert executor.execute(db, f"ATTACH '{target}' AS x").status == "error"
        assert executor.execute(db, f"VACUUM INTO '{target}'").status == "error"
        assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db"]


@pytest.mark.parametrize("sql", [RUNAWAY, CARTESIAN,
                                 CARTESIAN.replace("count(*)", "*") + " ORDER BY random()"])
def test_runaway_queries_time_out_within_the_limit(db, sql):
    executor = SQLExecutor(ExecLimits(timeout_s=0.5))
    start = time.monotonic()
    verdict = executor.execute(db, sql)
    assert verdict.status == "timeout" and "0.5 s" in verdict.error
    assert time.monotonic() - start < 3.0
    assert executor.execute(db, "SELECT count(*) FROM singer").rows == ((6,),)  # still usable


def test_row_and_value_caps_are_errors(db):
    executor = SQLExecutor(ExecLimits(max_rows=5, max_value_bytes=1_000))
    assert "more than 5 rows" in executor.execute(db, "SELECT * FROM singer").error
    assert executor.execute(db, "SELECT * FROM singer LIMIT 5").ok
    assert "too big" in executor.execute(db, "SELECT zeroblob(2000)").error
    assert "characters" in SQLExecutor(ExecLimits(max_sql_chars=10)).execute(
        db, "SELECT count(*) FROM singer").error


def test_gold_results_are_cached_per_database_and_sql(db):
    executor = SQLExecutor()
    first = executor.execute_gold(db, "SELECT name FROM singer")
    assert executor.execute_gold(db, "SELECT name FROM singer") is first
    assert executor.execute_gold(db, "SELECT age FROM singer") is not first
    assert executor.execute(db, "SELECT name FROM singer") is not first


def test_text_that_is_not_utf8_is_read_without_crashing(tmp_path):
    path = tmp_path / "latin.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (name text)")
        conn.executemany("INSERT INTO t VALUES (CAST(? AS TEXT))",
                         [(b"caf\xe9",), (b"caf\xe8",), (b"plain",)])
    conn.close()
    verdict = execute(path, "SELECT name FROM t ORDER BY rowid")
    assert verdict.ok
    assert verdict.rows[2] == ("plain",)
    assert verdict.rows[0] != verdict.rows[1]  # distinct bytes stay distinct values
    assert execute(path, "SELECT count(*) FROM t").rows == ((3,),)  # later queries unaffected


def test_unusable_arguments_give_verdicts(db, tmp_path):
    assert execute(db, None).status == "error"
    assert execute(db, b"SELECT 1").status == "error"
    assert execute(None, "SELECT 1").status == "error"
    not_a_db = tmp_path / "text.sqlite"
    not_a_db.write_text("this is not a database")
    assert execute(not_a_db, "SELECT 1 FROM t").status == "error"
