"""Feedback that becomes training data: POST /feedback stores judgements in SQLite
(sqlrl/feedback.py), `python -m sqlrl.feedback export` turns the verified ones into a Spider
train file, and POST /execute runs a person's SQL as the sandbox runs the model's. Also the
server's guarantees on these routes: 4xx with a reason, the API key, no record lost when the
server is killed mid-write, concurrent writers."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from sqlrl.data.spider import load_examples, load_schemas
from sqlrl.feedback import FeedbackStore, Judgement
from sqlrl.serve import create_app
from tests.repo_tools import REPO_ROOT, SPIDER_DIR
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    NAME_SQL,
    PAIRS,
    SETTINGS,
    serve_config,
    server_process,
    trained_model,
)

DB = "concert_singer"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_model(tmp_path_factory)


@pytest.fixture
def served(trained, tmp_path):
    """A server whose feedback goes to tmp_path/feedback.sqlite: (client, feedback file)."""
    path = tmp_path / "feedback.sqlite"
    app = create_app(serve_config(trained, feedback_db=str(path)), prompt_settings=SETTINGS)
    with TestClient(app) as client:
        yield client, path


def rows(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def judge(client, question, predicted, verdict, corrected=None, **where):
    body = {"question": question, "predicted_sql": predicted, "verdict": verdict, **where}
    if corrected is not None:
        body["corrected_sql"] = corrected
    return client.post("/feedback", json=body)


# --------------------------------------------------------------------------- store and export


def test_judgements_are_stored_and_exported_as_spider_train_data(served, trained, tmp_path):
    client, path = served
    given = [
        (PAIRS[0][0], COUNT_SQL, "right", None, {"db_id": DB}),  # 1: exported as it is
        ("Name every singer.", NAME_SQL, "wrong", "SELECT Name FROM singer", {"db_id": DB}),  # 2
        ("How old is the oldest singer?", COUNT_SQL, "wrong", None, {"db_id": DB}),  # 3: no fix
        (PAIRS[0][0], COUNT_SQL, "right", None, {"ddl": CONCERT_DDL}),  # 4: no database
        (
            "List the stadium capacities.",
            NAME_SQL,
            "wrong",
            "SELECT Capacty FROM stadium",
            {"db_id": DB},
        ),  # 5
        ("  What is the average singer age?  ", COUNT_SQL, "right", None, {"db_id": DB}),  # 6
        (
            "What is the average singer age?",
            COUNT_SQL,
            "wrong",
            "SELECT avg(Age) FROM singer",
            {"db_id": DB},
        ),  # 7
    ]
    for i, (question, predicted, verdict, corrected, where) in enumerate(given, 1):
        r = judge(client, question, predicted, verdict, corrected, **where)
        assert r.status_code == 200, r.text
        assert r.json()["id"] == i and r.json()["stored"] is True
    stored = rows(
        path,
        "SELECT db_id, question, predicted_sql, verdict, corrected_sql, model FROM feedback WHERE id = 2",
    )
    assert stored == [
        (DB, "Name every singer.", NAME_SQL, "wrong", "SELECT Name FROM singer", trained.name)
    ]
    assert rows(path, "PRAGMA journal_mode") == [("wal",)]
    assert all(t.endswith("+00:00") for (t,) in rows(path, "SELECT created_at FROM feedback"))

    out = tmp_path / "data" / "feedback" / "verified.json"
    cmd = [sys.executable, "-m", "sqlrl.feedback", "export", "--db", str(path)]
    cmd += ["--spider", str(SPIDER_DIR), "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = done.stdout
    assert f"exported 3 verified pairs to {out}; skipped 4" in report
    assert "1 marked wrong without a correction: #3" in report
    assert "1 schema given as DDL: no database to check the SQL on: #4" in report
    assert "1 does not run on its database: #5 (error: no such column: Capacty)" in report
    assert "1 superseded by a later judgement of the same question: #6 (#7)" in report

    # the file is Spider's train format: the pipeline's own loader reads it
    examples = load_examples(out, load_schemas(SPIDER_DIR / "tables.json"))
    assert [(e.db_id, e.question, e.query) for e in examples] == [
        (DB, PAIRS[0][0], COUNT_SQL),
        (DB, "Name every singer.", "SELECT Name FROM singer"),
        (DB, "What is the average singer age?", "SELECT avg(Age) FROM singer"),
    ]
    assert [item["feedback_id"] for item in json.loads(out.read_text())] == [1, 2, 7]
    first = out.read_bytes()
    assert subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, timeout=120).returncode == 0
    assert out.read_bytes() == first  # same judgements, same bytes: DVC sees no change


def test_export_says_what_is_wrong_with_its_input(tmp_path, capsys):
    from sqlrl.feedback import main

    assert (
        main(["export", "--db", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "o.json")])
        == 2
    )
    assert "no feedback database at" in capsys.readouterr().err
    with pytest.raises(SystemExit) as shown:
        main(["export", "--help"])
    assert shown.value.code == 0
    assert "--spider" in capsys.readouterr().out


def test_concurrent_writers_lose_nothing(tmp_path):
    """Eight threads (one connection each, as two server processes would be) write at once;
    every record is there, each once."""
    path = tmp_path / "feedback.sqlite"
    stores = [FeedbackStore(path), FeedbackStore(path)]

    def write(i: int) -> int:
        j = Judgement(f"question {i}", "SELECT 1", "right", "m", db_id=DB)
        return stores[i % 2].add(j).id

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(write, range(200)))
    assert sorted(ids) == list(range(1, 201))
    stored = {j.question for j in stores[0].all()}
    assert stored == {f"question {i}" for i in range(200)}


def test_killing_the_server_mid_burst_loses_no_acknowledged_record(trained, tmp_path):
    """SIGKILL while eight clients write: every judgement the server acknowledged is in the
    file, intact, and the file takes new writes."""
    path = tmp_path / "feedback.sqlite"
    acked: dict[int, str] = {}
    lock, enough = threading.Lock(), threading.Event()
    with server_process(trained, "--feedback-db", str(path)) as (proc, base):

        def client(k: int) -> None:
            with httpx.Client(base_url=base, timeout=30) as http:
                for i in range(10_000):
                    question = f"client {k} question {i}"
                    try:
                        r = http.post(
                            "/feedback",
                            json={
                                "question": question,
                                "predicted_sql": COUNT_SQL,
                                "verdict": "right",
                                "db_id": DB,
                            },
                        )
                    except httpx.HTTPError:
                        return  # the server is gone
                    assert r.status_code == 200, r.text
                    with lock:
                        acked[r.json()["id"]] = question
                        if len(acked) >= 60:
                            enough.set()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        assert enough.wait(120), "the server acknowledged too few writes"
        os.kill(proc.pid, signal.SIGKILL)
        for t in threads:
            t.join(60)
        assert proc.wait(30) == -signal.SIGKILL
    stored = dict(rows(path, "SELECT id, question FROM feedback"))
    assert {i: stored.get(i) for i in acked} == acked
    assert rows(path, "PRAGMA integrity_check") == [("ok",)]
    after = FeedbackStore(path).add(Judgement("after the kill", "SELECT 1", "right", "m", db_id=DB))
    assert after.id > max(acked)


# --------------------------------------------------------------------------- /execute


def test_execute_runs_sql_read_only_with_a_row_limit(served):
    client, _ = served
    r = client.post(
        "/execute",
        json={"db_id": DB, "sql": "SELECT Name FROM singer ORDER BY Name", "max_rows": 2},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["verdict"] == {"status": "ok", "error": ""}
    assert body["columns"] == ["Name"] and body["rows"] == [["Joe Sharp"], ["John Nizinik"]]
    assert body["truncated"] is True
    for sql in ("DELETE FROM singer", "DROP TABLE singer", "ATTACH 'x.db' AS x"):
        r = client.post("/execute", json={"db_id": DB, "sql": sql})
        assert r.status_code == 200 and r.json()["verdict"]["status"] == "error", sql
        assert r.json()["rows"] is None
    r = client.post("/execute", json={"db_id": DB, "sql": "SELECT count(*) FROM singer"})
    assert r.json()["rows"] == [[6]]  # nothing was deleted
    r = client.post("/execute", json={"db_id": DB, "sql": "SELEC oops"})
    assert (
        r.json()["verdict"]["status"] == "error" and "syntax error" in r.json()["verdict"]["error"]
    )


# --------------------------------------------------------------------------- refusals

BAD = [  # (route, body, status, fragment of the reason)
    (
        "/feedback",
        {"question": "Q?", "predicted_sql": "SELECT 1", "verdict": "maybe", "db_id": DB},
        422,
        "verdict",
    ),
    (
        "/feedback",
        {
            "question": "Q?",
            "predicted_sql": "SELECT 1",
            "verdict": "right",
            "db_id": DB,
            "corrected_sql": "SELECT 2",
        },
        422,
        "corrected_sql goes with verdict 'wrong'",
    ),
    (
        "/feedback",
        {"question": "Q?", "predicted_sql": "SELECT 1", "verdict": "right", "db_id": "nope"},
        404,
        "unknown db_id 'nope'",
    ),
    (
        "/feedback",
        {"question": "Q?", "predicted_sql": "SELECT 1", "verdict": "right"},
        422,
        "exactly one of db_id or ddl",
    ),
    (
        "/feedback",
        {
            "question": "Q?",
            "predicted_sql": "SELECT 1",
            "verdict": "right",
            "db_id": DB,
            "ddl": CONCERT_DDL,
        },
        422,
        "exactly one of db_id or ddl",
    ),
    (
        "/feedback",
        {"question": "   ", "predicted_sql": "SELECT 1", "verdict": "right", "db_id": DB},
        422,
        "question is empty",
    ),
    (
        "/feedback",
        {"question": "Q?", "predicted_sql": "  ", "verdict": "right", "db_id": DB},
        422,
        "predicted_sql is empty",
    ),
    (
        "/feedback",
        {"question": "Q?", "predicted_sql": "S" * 20_000, "verdict": "right", "db_id": DB},
        413,
        "predicted_sql is 20000 characters",
    ),
    (
        "/feedback",
        {"question": "Q" * 3000, "predicted_sql": "SELECT 1", "verdict": "right", "db_id": DB},
        413,
        "question is 3000 characters",
    ),
    (
        "/feedback",
        {"question": "Q?", "predicted_sql": "SELECT 1", "verdict": "right", "db_id": DB, "x": 1},
        422,
        "unknown field",
    ),
    (
        "/feedback",
        {"question": "Q?", "predicted_sql": "SELECT 1", "verdict": "right", "db_id": 5},
        422,
        "db_id",
    ),
    (
        "/feedback",
        {"question": "\ud800", "predicted_sql": "SELECT 1", "verdict": "right", "db_id": DB},
        400,
        "not valid Unicode",
    ),
    ("/execute", {"db_id": "nope", "sql": "SELECT 1"}, 404, "unknown db_id"),
    ("/execute", {"db_id": "../x", "sql": "SELECT 1"}, 422, "not a database name"),
    (
        "/execute",
        {"db_id": DB, "sql": "SELECT 1", "max_rows": 1000},
        422,
        "max_rows must be between 0 and 100",
    ),
    ("/execute", {"db_id": DB, "sql": "S" * 20_000}, 413, "sql is 20000 characters"),
    ("/execute", {"db_id": DB, "sql": ""}, 422, "sql is empty"),
    ("/execute", {"db_id": DB}, 422, "sql: Field required"),
]
RAW = [(b"", 400, "empty request body"), (b"{", 400, "not valid JSON"), (b"[]", 422, "JSON object")]


def test_malformed_feedback_and_queries_get_a_4xx_never_a_500(served):
    client, path = served
    for route, body, status, fragment in BAD:
        data = json.dumps(body).encode()
        r = client.post(route, content=data, headers={"content-type": "application/json"})
        assert r.status_code == status, (route, body, r.text[:300])
        assert fragment in r.json()["detail"], (route, r.json())
    for route in ("/feedback", "/execute"):
        for data, status, fragment in RAW:
            r = client.post(route, content=data)
            assert r.status_code == status and fragment in r.json()["detail"]
        r = client.post(route, content=b"x" * 300_000)
        assert r.status_code == 413
    assert rows(path, "SELECT count(*) FROM feedback") == [(0,)]  # nothing half-stored


def test_feedback_off_says_how_to_turn_it_on(trained):
    with TestClient(create_app(serve_config(trained), prompt_settings=SETTINGS)) as client:
        r = judge(client, "Q?", "SELECT 1", "right", db_id=DB)
    assert r.status_code == 503 and "--feedback-db" in r.json()["detail"]


def test_an_unusable_feedback_path_stops_the_server_with_its_reason(trained, tmp_path, capsys):
    from sqlrl.serve.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    flags = ["--model", str(trained), "--feedback-db", str(blocker / "feedback.sqlite")]
    assert main(flags) == 2
    assert "feedback database" in capsys.readouterr().err


# --------------------------------------------------------------------------- the API key

OPEN = {
    "/health",
    "/",
    "/playground.js",
    "/playground.css",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
}


def test_the_api_key_guards_every_route_but_health_the_page_and_the_docs(trained, tmp_path):
    """Every route the app has (new ones included, found from the app itself) refuses a
    request without the key; the page and its files hold no data."""
    app = create_app(
        serve_config(trained, api_key="k", feedback_db=str(tmp_path / "f.sqlite")),
        prompt_settings=SETTINGS,
    )
    routes = [(method, r.path) for r in app.routes for method in sorted(r.methods - {"HEAD"})]
    guarded = [(m, p) for m, p in routes if p not in OPEN]
    assert {p for _, p in guarded} >= {
        "/generate",
        "/v1/chat/completions",
        "/v1/models",
        "/databases",
        "/execute",
        "/feedback",
    }
    with TestClient(app) as client:
        for method, route in guarded:
            r = client.request(method, route, json={})
            assert r.status_code == 401, (method, route, r.text)
        for route in OPEN - {"/docs/oauth2-redirect"}:
            assert client.get(route).status_code == 200, route
        assert client.get("/health").json() == {"status": "ok"}
        page = client.get("/").text + client.get("/playground.js").text
        assert DB not in page and trained.name not in page
        key = {"authorization": "Bearer k"}
        r = client.post(
            "/feedback",
            headers=key,
            json={"question": "Q?", "predicted_sql": "SELECT 1", "verdict": "right", "db_id": DB},
        )
        assert r.status_code == 200
