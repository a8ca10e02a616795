"""The native routes (sqlrl/serve/routes/native.py): POST /generate on the tiny model trained in
tests/serve/conftest.py, and what a client reads about the server (/health, /v1/models,
/databases)."""

from __future__ import annotations

from sqlrl.request_input import RequestInput
from tests.repo_tools import SPIDER_DIR
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    NAME_SQL,
    PAIRS,
    SETTINGS,
)


def test_generate_returns_the_trained_sql_for_every_schema_form(client):
    schema_text = (
        RequestInput(SETTINGS, SPIDER_DIR)
        .messages("x", db_id="concert_singer")[1]["content"]
        .split("\n")[1]
    )
    for question, sql in PAIRS:
        r = client.post("/generate", json={"question": question, "db_id": "concert_singer"})
        assert r.status_code == 200, r.text
        assert r.json()["sql"] == sql
    # the form users already call, and CREATE TABLE statements: the same prompt, the same SQL
    r = client.post("/generate", json={"schema_str": schema_text, "question": PAIRS[0][0]})
    assert r.status_code == 200 and r.json()["sql"] == COUNT_SQL
    r = client.post("/generate", json={"ddl": CONCERT_DDL, "question": PAIRS[3][0]})
    assert r.status_code == 200 and r.json()["sql"] == NAME_SQL
    # an unseen question still gets a query (shape, not content)
    r = client.post(
        "/generate",
        json={
            "question": "How many singers are there in total?",
            "db_id": "concert_singer",
            "max_new_tokens": 12,
        },
    )
    assert r.status_code == 200 and r.json()["sql"].startswith("SELECT")


def test_execute_runs_the_sql_on_the_real_spider_database(client):
    r = client.post(
        "/generate", json={"question": PAIRS[0][0], "db_id": "concert_singer", "execute": True}
    )
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["sql"] == COUNT_SQL and body["verdict"] == {"status": "ok", "error": ""}
    assert body["columns"] == ["count(*)"] and body["rows"] == [[6]]
    assert body["truncated"] is False
    r = client.post(
        "/generate",
        json={"question": PAIRS[3][0], "db_id": "concert_singer", "execute": True, "max_rows": 2},
    )
    body = r.json()
    assert body["sql"] == NAME_SQL and len(body["rows"]) == 2 and body["truncated"] is True


def test_num_samples_votes_by_execution(client):
    r = client.post(
        "/generate",
        json={
            "question": PAIRS[0][0],
            "db_id": "concert_singer",
            "execute": True,
            "num_samples": 4,
            "temperature": 0.3,
            "seed": 3,
        },
    )
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["num_samples"] == 4 and len(body["candidates"]) == 4
    assert body["vote"] == "execution" and body["votes"] >= 1
    assert body["sql"] in body["candidates"] and body["rows"] == [[6]]
    r = client.post(
        "/generate", json={"question": PAIRS[0][0], "db_id": "concert_singer", "num_samples": 2}
    )  # no execution: the commonest text
    assert r.status_code == 200 and r.json()["vote"] == "sql_text"


def test_health_models_and_databases(client, trained):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model_loaded"] is True
    assert health["backend"] == "transformers" and health["model"] == trained.name
    assert health["spider"]["databases"] > 100
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == trained.name
    dbs = {d["db_id"]: d for d in client.get("/databases").json()["databases"]}
    assert dbs["concert_singer"]["present"] and not dbs["wta_1"]["present"]


def test_databases_health_and_models_reveal_no_server_paths(client, trained):
    """Issue item 7: /databases used to return the absolute Spider path."""
    for path in ("/databases", "/health", "/v1/models"):
        r = client.get(path)
        assert r.status_code == 200
        for secret in (str(SPIDER_DIR), str(SPIDER_DIR.resolve()), str(trained)):
            assert secret not in r.text, (path, secret)
    assert "concert_singer" in client.get("/databases").text
