"""The server on a live PostgreSQL database (`--database NAME=URL`), started by the tests
(tests/postgres_helpers.py) with Spider's concert_singer copied in and reached through the
least-privilege role: /generate, the OpenAI client, the playground in a headless browser and
feedback ask it and show the transpiled SQL; hostile SQL through every route is refused
(4xx, or a `refused` verdict for the model's own SQL) or bounded, every table's checksum is
unchanged after, and the server stays up. No response or log line shows the password."""

from __future__ import annotations

import contextlib
import logging
import sqlite3

import httpx
import openai
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from sqlrl.serve import create_app
from sqlrl.serve.cli import build_parser, main
from tests.live.test_databases import HOSTILE
from tests.postgres_helpers import PG_DATABASES, READER_PASSWORD
from tests.serve_helpers import (
    COUNT_SQL,
    SETTINGS,
    Q,
    ScriptedGenerator,
    ask,
    scripted_app,
    serve_config,
    serving,
    wait_for,
)

KEY = "live-key"
PG = "pg_concert"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def pg_site(trained, postgres, tmp_path_factory):
    """The trained model served with Spider and the PostgreSQL copy of concert_singer."""
    feedback = tmp_path_factory.mktemp("live_feedback") / "feedback.sqlite"
    config = serve_config(
        trained,
        api_key=KEY,
        feedback_db=str(feedback),
        database=(f"{PG}={postgres.reader_url('concert_singer')}",),
    )
    with serving(create_app(config, prompt_settings=SETTINGS)) as base:
        yield base, feedback


def post(base: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(base + path, json=body, headers=AUTH, timeout=60)


def test_generate_answers_from_postgresql_with_the_sql_it_ran(pg_site):
    base, _ = pg_site
    listed = httpx.get(base + "/databases", headers=AUTH).json()["databases"]
    live = [d for d in listed if d.get("live")]
    assert live == [
        {
            "db_id": PG,
            "dialect": "postgres",
            "live": True,
            "present": True,
            "tables": ["stadium", "singer", "concert", "singer_in_concert"],
        }
    ]
    r = post(base, "/generate", {"db_id": PG, "question": Q, "execute": True}).json()
    assert r["sql"] == COUNT_SQL  # the model's SQLite ...
    assert r["executed_sql"] == 'SELECT COUNT(*) FROM "singer"'  # ... as PostgreSQL ran it
    assert r["dialect"] == "postgres" and r["rows"] == [[6]]
    assert r["schema_tables"]["dropped"] == [] and len(r["schema_tables"]["kept"]) == 4
    schema = httpx.get(base + f"/databases/{PG}", headers=AUTH).json()
    assert schema["dialect"] == "postgres" and schema["foreign_keys"]
    health = httpx.get(base + "/health", headers=AUTH).json()
    assert health["live_databases"] == {PG: "postgres"}
    for body in (listed, r, schema, health):
        assert READER_PASSWORD not in str(body) and "127.0.0.1:" not in str(body)


def test_the_openai_client_asks_the_postgresql_database(pg_site, trained):
    base, _ = pg_site
    client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=60)
    r = client.chat.completions.create(
        model=trained.name,
        messages=[{"role": "user", "content": Q}],
        extra_body={"db_id": PG, "execute": True},
    )
    assert r.choices[0].message.content == COUNT_SQL
    extra = r.model_extra["sqlrl"]
    assert extra["executed_sql"] == 'SELECT COUNT(*) FROM "singer"' and extra["rows"] == [[6]]
    assert extra["dialect"] == "postgres"


def test_feedback_keeps_the_database_and_its_dialect(pg_site):
    base, feedback = pg_site
    body = {"db_id": PG, "question": Q, "predicted_sql": COUNT_SQL, "verdict": "right"}
    stored = post(base, "/feedback", body).json()
    assert stored["stored"] and stored["dialect"] == "postgres"
    with contextlib.closing(sqlite3.connect(feedback)) as conn:
        row = conn.execute("SELECT db_id, dialect FROM feedback WHERE id = ?", (stored["id"],))
        assert row.fetchone() == (PG, "postgres")
    wrong = {**body, "verdict": "wrong", "corrected_sql": "SELECT pg_sleep(600)"}
    r = post(base, "/feedback", wrong)
    assert r.status_code == 422 and "pg_sleep" in r.json()["detail"]


def test_a_refresh_reads_a_new_table(pg_site, postgres):
    base, _ = pg_site
    with postgres.admin("concert_singer") as conn:
        conn.execute("CREATE TABLE added (a int)")
        conn.execute("GRANT SELECT ON added TO sqlrl_reader")
    try:
        r = httpx.post(base + f"/databases/{PG}/refresh", headers=AUTH).json()
        assert [t["name"] for t in r["tables"]][-1] == "added"
    finally:
        with postgres.admin("concert_singer") as conn:
            conn.execute("DROP TABLE added")
        httpx.post(base + f"/databases/{PG}/refresh", headers=AUTH)
    assert httpx.post(base + "/databases/concert_singer/refresh", headers=AUTH).status_code == 404


def test_hostile_sql_through_every_route_changes_nothing(pg_site, postgres, trained, tokenizer):
    base, _ = pg_site
    before = {name: postgres.checksums(name) for name in PG_DATABASES}
    for sql in HOSTILE:
        r = post(base, "/execute", {"db_id": PG, "sql": sql})
        assert r.status_code == 422 and r.json()["detail"].startswith("refused: "), (sql, r.text)
        body = {"db_id": PG, "question": Q, "predicted_sql": sql, "verdict": "right"}
        assert post(base, "/feedback", body).status_code == 422, sql
    # bounded, not refused: the first rows of a cross join, a sort of one stopped in time
    cross = "SELECT * FROM singer a, singer b, singer c, singer d, singer e"
    r = post(base, "/execute", {"db_id": PG, "sql": cross, "max_rows": 5}).json()
    assert len(r["rows"]) == 5 and r["truncated"]
    # the model's own SQL: /generate and the chat endpoint carry the refusal in its verdict
    model = ScriptedGenerator()
    app = scripted_app(
        trained, tokenizer, model, database=(f"{PG}={postgres.reader_url('concert_singer')}",)
    )
    chat = {"model": "m", "messages": [{"role": "user", "content": Q}], "execute": True}
    with serving(app) as scripted:
        for sql in HOSTILE:
            model.text = sql
            r = httpx.post(
                scripted + "/generate", json={"db_id": PG, "question": Q, "execute": True}
            ).json()
            assert r["verdict"]["status"] == "refused" and r["rows"] is None, (sql, r)
            r = httpx.post(scripted + "/v1/chat/completions", json={**chat, "db_id": PG}).json()
            assert r["sqlrl"]["verdict"]["status"] == "refused", (sql, r)
    assert {name: postgres.checksums(name) for name in PG_DATABASES} == before
    assert httpx.get(base + "/health").json()["status"] == "ok"
    r = post(base, "/execute", {"db_id": PG, "sql": "SELECT count(*) FROM singer"}).json()
    assert r["rows"] == [[6]]


def test_the_database_flag_is_repeatable_and_its_password_never_shown(
    trained, postgres, capsys, caplog
):
    url = postgres.reader_url("concert_singer")
    args = build_parser().parse_args(["--database", f"a={url}", "--database", "b=sqlite:///x"])
    assert args.database == [f"a={url}", "b=sqlite:///x"]
    assert READER_PASSWORD not in build_parser().format_help()
    wrong = url.replace(READER_PASSWORD, "wrong-" + READER_PASSWORD)
    caplog.set_level(logging.INFO)
    code = main(["--model", str(trained), "--database", f"{PG}={wrong}"])
    err = capsys.readouterr().err
    assert code == 2 and "password authentication failed" in err and ":***@" in err
    assert READER_PASSWORD not in err and READER_PASSWORD not in caplog.text


def test_the_playground_asks_the_postgresql_database(browser, pg_site):
    """Pick the live database (listed with its dialect), ask, run: the rows and the SQL as
    PostgreSQL ran it."""
    base, _ = pg_site
    browser.get(base + "/")
    key = browser.find_element(By.ID, "key")
    key.clear()
    key.send_keys(KEY + "\n")
    browser.execute_script("document.getElementById('key').dispatchEvent(new Event('change'))")
    # read in one script: the page rebuilds the list once the key is in (a held element goes stale)
    label = f"const o = document.querySelector('#db option[value={PG}]'); return o && o.text"
    wait_for(browser, lambda d: d.execute_script(label) == f"{PG} (live postgres)", "the db")
    Select(browser.find_element(By.ID, "db")).select_by_value(PG)
    wait_for(
        browser, lambda d: "singer_in_concert" in d.find_element(By.ID, "schema").text, "schema"
    )
    ask(browser, Q, COUNT_SQL)
    browser.find_element(By.ID, "run").click()
    wait_for(browser, lambda d: "row" in d.find_element(By.ID, "rows-note").text, "the rows")
    cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#rows tbody td")]
    assert cells == ["6"]
    shown = browser.find_element(By.ID, "executed").text
    assert shown == 'ran on postgres as SELECT COUNT(*) FROM "singer"'
