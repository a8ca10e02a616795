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
from sqlrl.feedback import FeedbackError, FeedbackStore, Judgement
from sqlrl.serve import create_app
from sqlrl.serve.trust import PAGE_TOKEN_HEADER
from tests.repo_tools import REPO_ROOT, SPIDER_DIR
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    DB,
    LOCAL_URL,
    NAME_SQL,
    PAIRS,
    SETTINGS,
    page_token,
    serve_config,
    server_process,
)


@pytest.fixture
def served(trained, tmp_path):
    """A server whose feedback goes to tmp_path/feedback.sqlite: (client, feedback file)."""
    path = tmp_path / "feedback.sqlite"
    app = create_app(serve_config(trained, feedback_db=str(path)), prompt_settings=SETTINGS)
    with TestClient(app, base_url=LOCAL_URL) as client:
        client.headers[PAGE_TOKEN_HEADER] = page_token(client)  # as the playground page writes
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


def export_cli(db: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """`python -m sqlrl.feedback export` as a user runs it."""
    cmd = [sys.executable, "-m", "sqlrl.feedback", "export", "--db", str(db)]
    cmd += ["--spider", str(SPIDER_DIR), "--out", str(out), *flags]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_judgements_are_stored_and_exported_as_spider_train_data(served, trained, tmp_path):
    client, path = served
    given = [
        (PAIRS[0][0], COUNT_SQL, "right", None, {"db_id": DB}),  # 1: exported as it is
        ("Name every singer.", NAME_SQL, "wrong", "SELECT Name FROM singer", {"db_id": DB}),  # 2
        ("How old is the oldest singer?", COUNT_SQL, "wrong", None, {"db_id": DB}),  # 3: no fix
        (PAIRS[0][0], COUNT_SQL, "right", None, {"ddl": CONCERT_DDL}),  # 4: no database
        ("  What is the average singer age?  ", COUNT_SQL, "right", None, {"db_id": DB}),  # 5
        (
            "What is the average singer age?",
            COUNT_SQL,
            "wrong",
            "SELECT avg(Age) FROM singer",
            {"db_id": DB},
        ),  # 6
    ]
    for i, (question, predicted, verdict, corrected, where) in enumerate(given, 1):
        r = judge(client, question, predicted, verdict, corrected, **where)
        assert r.status_code == 200, r.text
        assert r.json()["id"] == i and r.json()["stored"] is True
        assert r.json()["writer"] == "local page" and r.json()["model"] == trained.name
    stored = rows(
        path,
        "SELECT db_id, question, predicted_sql, verdict, corrected_sql, model, writer "
        "FROM feedback WHERE id = 2",
    )
    assert stored == [
        (
            DB,
            "Name every singer.",
            NAME_SQL,
            "wrong",
            "SELECT Name FROM singer",
            trained.name,
            "local page",
        )
    ]
    assert rows(path, "PRAGMA journal_mode") == [("wal",)]
    assert all(t.endswith("+00:00") for (t,) in rows(path, "SELECT created_at FROM feedback"))

    out = tmp_path / "data" / "feedback" / "verified.json"
    done = export_cli(path, out)
    assert done.returncode == 0, done.stderr
    report = done.stdout
    assert f"exported 3 verified pairs to {out}; skipped 3" in report
    assert "1 marked wrong without a correction: #3" in report
    assert "1 schema given as DDL: no database to check the SQL on: #4" in report
    assert "1 superseded by a later judgement of the same question: #5 (#6)" in report

    # the file is Spider's train format: the pipeline's own loader reads it
    examples = load_examples(out, load_schemas(SPIDER_DIR / "tables.json"))
    assert [(e.db_id, e.question, e.query) for e in examples] == [
        (DB, PAIRS[0][0], COUNT_SQL),
        (DB, "Name every singer.", "SELECT Name FROM singer"),
        (DB, "What is the average singer age?", "SELECT avg(Age) FROM singer"),
    ]
    assert [item["feedback_id"] for item in json.loads(out.read_text())] == [1, 2, 6]
    first = out.read_bytes()
    assert export_cli(path, out).returncode == 0
    assert out.read_bytes() == first  # same judgements, same bytes: DVC sees no change


def test_sql_that_does_not_run_is_refused_with_its_error_and_stores_nothing(served):
    """A correction (or an answer marked right) is run read-only before it is stored: a slip
    is answered with the database's error, and the verified pair before it stands."""
    client, path = served
    assert judge(client, PAIRS[0][0], COUNT_SQL, "right", db_id=DB).status_code == 200
    r = judge(client, PAIRS[0][0], COUNT_SQL, "wrong", "SELECT Nme FROM singr", db_id=DB)
    assert r.status_code == 422
    assert r.json()["detail"] == (
        "the correction does not run on concert_singer, so it was not stored: "
        "error: no such table: singr"
    )
    r = judge(client, "Name every singer.", "SELECT Nam FROM singer", "right", db_id=DB)
    assert r.status_code == 422 and "no such column: Nam" in r.json()["detail"]
    assert rows(path, "SELECT id, verdict FROM feedback") == [(1, "right")]


def test_a_newer_judgement_never_silently_erases_a_verified_pair(tmp_path):
    """Records that reach the store unchecked (the database changed since, or written by
    an older server): of one question's judgements the newest whose SQL runs stands, a newer
    failure is reported, and a later "wrong" on the very same SQL retracts it."""
    path = tmp_path / "feedback.sqlite"
    store = FeedbackStore(path)
    q1, q2 = PAIRS[0][0], "Name every singer."
    for j in (
        Judgement(q1, COUNT_SQL, "right", "m", db_id=DB, writer="local page"),  # 1: stands
        Judgement(q1, COUNT_SQL, "wrong", "m", DB, None, "SELECT x FROM y", "local page"),  # 2
        Judgement(q2, NAME_SQL, "right", "m", db_id=DB, writer="key:0123"),  # 3: retracted
        Judgement(q2, NAME_SQL, "wrong", "m", db_id=DB, writer="key:0123"),  # 4
    ):
        store.add(j)
    out = tmp_path / "verified.json"
    done = export_cli(path, out)
    assert done.returncode == 0, done.stderr
    assert [(i["feedback_id"], i["query"]) for i in json.loads(out.read_text())] == [(1, COUNT_SQL)]
    assert "1 does not run on its database: #2 (error: no such table: y)" in done.stdout
    assert "1 marked wrong by a later judgement: #3 (#4)" in done.stdout
    assert "1 marked wrong without a correction: #4" in done.stdout
    assert len(store.all()) == 4  # nothing is deleted from the store


def test_records_from_before_writers_were_recorded_are_left_out_unless_asked(tmp_path):
    """A feedback file of the first schema (no writer column) is upgraded in place; its
    records are unattributed, so the export leaves them out and says how to include them."""
    path = tmp_path / "feedback.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE feedback (id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT "
            "NULL, model TEXT NOT NULL, db_id TEXT, ddl TEXT, question TEXT NOT NULL, "
            "predicted_sql TEXT NOT NULL, verdict TEXT NOT NULL, corrected_sql TEXT)"
        )
        conn.execute(
            "INSERT INTO feedback (created_at, model, db_id, question, predicted_sql, verdict) "
            "VALUES ('2026-01-01T00:00:00.000+00:00', 'm', ?, ?, ?, 'right')",
            (DB, PAIRS[0][0], COUNT_SQL),
        )
        conn.execute("PRAGMA user_version=1")
    store = FeedbackStore(path)
    store.add(Judgement("Name every singer.", NAME_SQL, "right", "m", db_id=DB, writer="key:ab"))
    assert [j.writer for j in store.all()] == [None, "key:ab"]
    assert rows(path, "PRAGMA user_version") == [(3,)]  # writer, then dialect, added
    out = tmp_path / "verified.json"
    done = export_cli(path, out)
    assert "exported 1 verified pair" in done.stdout
    assert (
        "1 no recorded writer (stored before writers were recorded; --include-unattributed): #1"
        in done.stdout
    )
    done = export_cli(path, out, "--include-unattributed")
    assert [i["feedback_id"] for i in json.loads(out.read_text())] == [1, 2]
    with pytest.raises(FeedbackError, match="must name its writer"):
        store.add(Judgement("q", COUNT_SQL, "right", "m", db_id=DB))


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
        j = Judgement(f"question {i}", "SELECT 1", "right", "m", db_id=DB, writer="key:ab")
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
                http.headers[PAGE_TOKEN_HEADER] = page_token(http)
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
    after = FeedbackStore(path).add(
        Judgement("after the kill", "SELECT 1", "right", "m", db_id=DB, writer="local page")
    )
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
    as_json = {"content-type": "application/json"}
    for route in ("/feedback", "/execute"):
        for data, status, fragment in RAW:
            r = client.post(route, content=data, headers=as_json)
            assert r.status_code == status and fragment in r.json()["detail"]
        r = client.post(route, content=b"x" * 300_000, headers=as_json)
        assert r.status_code == 413
    assert rows(path, "SELECT count(*) FROM feedback") == [(0,)]  # nothing half-stored


def test_feedback_off_says_how_to_turn_it_on(trained):
    with TestClient(
        create_app(serve_config(trained), prompt_settings=SETTINGS), base_url=LOCAL_URL
    ) as client:
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
    routes = [
        (method, r.path)
        for r in app.routes
        if hasattr(r, "methods")  # not the mount of /docs' own scripts (open, like /docs)
        for method in sorted(r.methods - {"HEAD"})
    ]
    guarded = [(m, p) for m, p in routes if p not in OPEN]
    assert {p for _, p in guarded} >= {
        "/generate",
        "/v1/chat/completions",
        "/v1/models",
        "/databases",
        "/execute",
        "/feedback",
    }
    with TestClient(app, base_url=LOCAL_URL) as client:
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
