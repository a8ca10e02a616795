"""The Python API (sqlrl/text_to_sql.py): `TextToSQL(model)(question, db=...)` answers as the
server does, finds the pulled Spider from any folder, and needs no HTTP package."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.repo_tools import SPIDER_DIR
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    PAIRS,
)


def test_python_api_answers_as_the_server_does(client, trained):
    """`TextToSQL(model)(question, db=...)`: the prompt settings saved with the model, the
    same extraction, repair, execution and voting as the server (and evaluation)."""
    from sqlrl.text_to_sql import TextToSQL

    t = TextToSQL(trained, spider_dir=SPIDER_DIR, max_new_tokens=24)
    for question, sql in PAIRS[:4]:
        assert t(question, db="concert_singer") == sql
        served = client.post("/generate", json={"question": question, "db_id": "concert_singer"})
        assert served.json()["sql"] == sql
    answer = t.answer(PAIRS[0][0], db="concert_singer", execute=True)
    assert answer.verdict.ok and answer.verdict.rows == ((6,),)
    voted = t.answer(
        PAIRS[0][0], db="concert_singer", execute=True, num_samples=4, temperature=0.3, seed=3
    )
    assert (
        voted.vote == "execution" and len(voted.candidates) == 4 and voted.sql in voted.candidates
    )
    assert t(PAIRS[0][0], ddl=CONCERT_DDL) == COUNT_SQL
    with pytest.raises(ValueError, match="exactly one of db, schema or ddl"):
        t(PAIRS[0][0], db="concert_singer", ddl=CONCERT_DDL)
    with pytest.raises(ValueError, match="unknown db_id 'nope'") as refused:
        t(PAIRS[0][0], db="nope")
    assert "server" not in str(refused.value) and "databases()" in str(refused.value)
    assert "concert_singer" in t.databases()


def test_python_api_finds_the_pulled_spider_from_any_folder(trained, tmp_path, monkeypatch):
    """Run from another folder, `TextToSQL(model)` still reads this checkout's Spider; a
    broken Spider folder is named with what is wrong (no server, no log to point at)."""
    from sqlrl.text_to_sql import TextToSQL

    monkeypatch.chdir(tmp_path)
    t = TextToSQL(trained, max_new_tokens=24)
    assert t(PAIRS[0][0], db="concert_singer") == PAIRS[0][1]
    (tmp_path / "tables.json").write_text("{")
    broken = TextToSQL(trained, spider_dir=tmp_path, max_new_tokens=24)
    with pytest.raises(ValueError, match=str(tmp_path)) as refused:
        broken(PAIRS[0][0], db="concert_singer")
    assert "server" not in str(refused.value)


def test_the_python_api_builds_its_prompts_without_the_http_package():
    """TextToSQL and the request input it shares with the server import no FastAPI."""
    code = (
        "import sys, sqlrl.text_to_sql, sqlrl.request_input; "
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_python_api_asks_a_live_postgresql_database(trained, postgres, private_db):
    """`TextToSQL(model, database=URL)`: the database is introspected into the trained prompt
    and is every call's default; execute runs the answer as PostgreSQL (executed_sql)."""
    from sqlrl.text_to_sql import TextToSQL

    t = TextToSQL(
        trained,
        spider_dir=SPIDER_DIR,
        max_new_tokens=24,
        database=postgres.reader_url("concert_singer"),
    )
    assert t.database == "concert_singer_live"  # Spider's concert_singer keeps its name
    assert t(PAIRS[0][0]) == COUNT_SQL
    answer = t.answer(PAIRS[0][0], execute=True)
    assert answer.verdict.rows == ((6,),)
    assert answer.verdict.executed_sql == 'SELECT COUNT(*) FROM "singer"'
    t.refresh()
    lite = TextToSQL(
        trained, spider_dir=None, max_new_tokens=24, database=f"sqlite:///{private_db}"
    )
    assert lite.answer(PAIRS[0][0], execute=True).verdict.rows == ((6,),)
