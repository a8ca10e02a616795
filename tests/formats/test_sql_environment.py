"""The agent rollout's execute_sql tool: the sandbox, bounded observations, the turn limit."""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import subprocess
import sys
import time

import pytest

from sqlrl.formats.sql_environment import SQLEnvironment, environment_factory
from sqlrl.sql.executor import ExecLimits
from tests.repo_tools import REPO_ROOT


@pytest.fixture
def private_db(spider_dir, tmp_path):
    """A writable copy of concert_singer: a write that got through would change its bytes."""
    target = tmp_path / "concert_singer.sqlite"
    shutil.copyfile(spider_dir / "database" / "concert_singer" / "concert_singer.sqlite", target)
    target.chmod(0o644)
    return target


def _md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _env(db, **bounds) -> SQLEnvironment:
    env = SQLEnvironment(ExecLimits(timeout_s=0.5), **bounds)
    env.reset(prompt=[], gold_sql="SELECT 1", db_id="concert_singer", question="q", db_path=db)
    return env


def test_a_query_shows_its_columns_rows_and_row_count(private_db):
    env = _env(str(private_db), max_rows=2)
    text = env.execute_sql("SELECT name, age FROM singer ORDER BY age DESC")
    lines = text.splitlines()
    assert lines[0] == "(6 rows, first 2 shown)"
    assert lines[1] == "Name | Age"  # the names as the table declares them
    assert lines[2:] == ["Joe Sharp | 52", "John Nizinik | 43"]
    assert env.execute_sql("SELECT count(*) AS n FROM stadium") == "(1 row)\nn\n9"


@pytest.mark.parametrize(
    "query",
    [
        "INSERT INTO singer (name) VALUES ('x')",
        "DROP TABLE singer",
        "DELETE FROM concert",
        "ATTACH DATABASE ':memory:' AS other",
        "PRAGMA journal_mode = WAL",
        "PRAGMA writable_schema = ON",
        "CREATE TABLE t (x)",
        "SELECT 1; DROP TABLE singer",
    ],
)
def test_a_write_attempt_is_an_error_observation_and_the_file_is_unchanged(private_db, query):
    before = _md5(private_db)
    env = _env(str(private_db))
    text = env.execute_sql(query)
    assert text.startswith("error: ") and len(text) <= env.max_chars
    assert _md5(private_db) == before
    assert env.stats.failed_calls == env.stats.calls == 1


def test_a_runaway_recursive_query_is_stopped_at_the_reward_time_limit(private_db):
    env = _env(str(private_db))
    before = _md5(private_db)
    start = time.monotonic()
    text = env.execute_sql(
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
    )
    assert time.monotonic() - start < 5
    assert text == "error: over the 0.5 s limit"
    assert _md5(private_db) == before


def test_a_huge_result_is_refused_or_cut_never_shown_whole(private_db):
    """A cross join of 6 x 9 x 6 x 6 x 16 rows is over the sandbox's row cap (an error); one
    under it is counted and cut to max_rows rows and max_chars characters."""
    env = _env(str(private_db), max_rows=3, max_chars=200)
    before = _md5(private_db)
    huge = env.execute_sql("SELECT * FROM singer, stadium, concert, singer_in_concert, singer")
    assert huge.startswith("error: ") and len(huge) <= 200
    wide = env.execute_sql("SELECT * FROM singer a, stadium b, singer c")
    assert wide.startswith("(324 rows, first 3 shown)\n") and len(wide) <= 200
    assert wide.endswith(" ... [cut at 200 characters]")
    assert _md5(private_db) == before


def test_calls_past_max_turns_get_an_error_and_reset_starts_over(private_db):
    env = _env(str(private_db), max_turns=2)
    assert not env.execute_sql("SELECT 1").startswith("error")
    assert not env.execute_sql("SELECT 2").startswith("error")
    assert env.execute_sql("SELECT 3") == "error: no more queries: at most 2 per question"
    env.reset(db_path=str(private_db))
    assert env.execute_sql("SELECT 4").endswith("4")
    assert (env.stats.episodes, env.stats.calls, env.stats.failed_calls) == (2, 4, 1)


def test_an_absent_database_is_an_error_observation(tmp_path):
    env = _env(str(tmp_path / "absent.sqlite"))
    assert env.execute_sql("SELECT 1").startswith("error: database absent")


def test_trl_sees_one_tool_with_a_described_query_argument():
    """TRL builds the environment with no arguments and turns every public method but reset
    into a tool, its JSON schema read from the docstring (transformers' get_json_schema)."""
    from transformers.utils import get_json_schema

    factory, stats = environment_factory(ExecLimits(), 3, 5, 500)
    env = factory()
    tools = [
        name
        for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if not name.startswith("_") and name != "reset"
    ]
    assert tools == ["execute_sql"]
    schema = get_json_schema(env.execute_sql)["function"]
    assert schema["name"] == "execute_sql"
    assert schema["parameters"]["required"] == ["query"]
    assert schema["parameters"]["properties"]["query"]["type"] == "string"
    assert env.stats is stats and factory().stats is stats  # one count over a run's rollouts


# A fresh process, so that SQLite's process-wide heap holds only what the environments take.
ENVIRONMENTS_CHILD = """
import json, sys
from sqlrl.sql.executor import ExecLimits
from sqlrl.formats.sql_environment import environment_factory
spider, mode = sys.argv[1], sys.argv[2]
factory, stats = environment_factory(ExecLimits(), 5, 10, 1000)
def db(name):
    return f"{spider}/database/{name}/{name}.sqlite"
failed = []
def call(env, db_id, table):
    env.reset(db_path=db(db_id))
    text = env.execute_sql(f"SELECT count(*) FROM {table}")
    if text.startswith("error"):
        failed.append(text)
if mode == "pool":  # TRL: one environment per rollout, reused batch after batch
    tables = {"chinook_1": "PlaylistTrack", "store_1": "playlist_tracks",
              "bike_1": "trip", "college_2": "takes"}
    names = list(tables)
    pool = [factory() for _ in range(128)]
    for batch in range(6):
        for i, env in enumerate(pool):
            name = names[(i + batch) % len(names)]
            call(env, name, tables[name])
else:  # evaluation: one environment per episode, all alive until the split is done
    episodes = []
    for _ in range(1500):
        episodes.append(factory())
        call(episodes[-1], "pets_1", "Student")
print(json.dumps({"calls": stats.calls, "failed": len(failed), "first": failed[:1]}))
"""


@pytest.mark.parametrize(
    "mode, calls",
    [("pool", 128 * 6), ("episodes", 1500)],
)
def test_many_environments_never_run_sqlites_heap_out(spider_dir, mode, calls):
    """GRPO keeps one environment per rollout (128 a GPU at the reference settings), each
    reset to a new row's database every batch; evaluation keeps one per episode of a split.
    With an executor each, SQLite's process-wide heap ran out and calls failed with
    `error: internal: MemoryError`: from the 3rd batch on four 0.9-2 MB databases, from the
    551st episode on a 16 KB one."""
    result = subprocess.run(
        [sys.executable, "-c", ENVIRONMENTS_CHILD, str(spider_dir), mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"calls": calls, "failed": 0, "first": []}
