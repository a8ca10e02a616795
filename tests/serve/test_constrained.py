"""Schema-constrained decoding in the server and the Python API (issue 46, docs/grammar.md):
`constrained` per request (/generate's body, the OpenAI endpoint's extra_body), the server's
--constrained, and `TextToSQL(..., constrained=True)`.

The vLLM backends run on tests/vllm_stand_in.py here (the SamplingParams they send); the real
engine decodes under the grammar in tests/serve/test_vllm.py (`pytest -m vllm`).

Real: the tiny model of tests/serve/conftest.py (trained on concert_singer only, to answer
`SELECT count(*) FROM singer` and `SELECT Name FROM stadium`), the transformers backend and its
batcher, xgrammar, Spider's tables. On another database the model writes `FROM singer`
again, a table that database lacks; constrained, it can name only that database's tables and
columns (a query cut at max_new_tokens is still a prefix of one the grammar accepts)."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.data.spider import load_schemas
from sqlrl.eval.evaluate import ConstrainedFormatError
from sqlrl.request_input import NO_PARSED_SCHEMA, RequestInput, schema_from_ddl
from sqlrl.serve import create_app
from sqlrl.sql.grammar import grammar_text, matcher_for
from sqlrl.sql.identifiers import absent_names
from tests.repo_tools import SPIDER_DIR
from tests.serve_helpers import COUNT_SQL, LOCAL_URL, SETTINGS, serve_config
from tests.vllm_stand_in import install, sent, vllm_package

pytest.importorskip("xgrammar")

Q = "How many flights are there?"
OTHER_DBS = ("flight_2", "car_1", "world_1")  # databases without a `singer` table
# a schema the model never saw, as CREATE TABLE statements
AIRLINES_DDL = """
CREATE TABLE airlines (uid INT PRIMARY KEY, Airline TEXT, Abbreviation TEXT, Country TEXT);
CREATE TABLE airports (City TEXT, AirportCode TEXT PRIMARY KEY, AirportName TEXT);
"""
REASONING = PromptSettings("compact", 0, "SQL only.", rollout="reasoning")


@pytest.fixture(scope="module")
def schemas():
    return load_schemas(SPIDER_DIR / "tables.json")


def only_its_names(completion: str, schema) -> bool:
    """Whether `completion` is on a path of `schema`'s grammar and, where it is a whole query,
    names only the schema's tables and columns."""
    if not matcher_for(schema).accept_string(completion):
        return False
    return absent_names(completion, schema) in ([], None)  # None: cut mid-query


def chat(client, system: str | None = None, **extra):
    """POST /v1/chat/completions asking Q (after `system`, a system message), `extra` the
    fields a client sends with extra_body."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": Q})
    return client.post("/v1/chat/completions", json={"model": "m", "messages": messages, **extra})


def generate(client, **body):
    r = client.post("/generate", json={"question": Q, "max_new_tokens": 24, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_constrained_request_names_only_its_databases_tables(client, schemas):
    """Unconstrained, the model names `singer` on databases that lack it; with
    `"constrained": true` every answer is on its database's grammar, and at least one is a
    whole query over that database's own tables (`FROM airlines` on flight_2)."""
    finished = 0
    for db in OTHER_DBS:
        free = generate(client, db_id=db)
        assert "constrained" not in free  # not asked: the body as before the setting
        assert "singer" in absent_names(free["completion"], schemas[db])
        held = generate(client, db_id=db, constrained=True)
        assert held["constrained"] is True and "unconstrained_reason" not in held
        assert only_its_names(held["completion"], schemas[db]), held["completion"]
        assert not matcher_for(schemas[db]).accept_string(free["completion"])
        finished += absent_names(held["completion"], schemas[db]) == []
    assert finished >= 1
    # on the database it was trained on, the grammar changes nothing
    same = generate(client, db_id="concert_singer", constrained=True)
    assert same["constrained"] is True and same["completion"] == COUNT_SQL


def test_a_ddl_request_is_held_to_its_create_table_names(client):
    schema = schema_from_ddl(AIRLINES_DDL)
    free = generate(client, ddl=AIRLINES_DDL)
    assert "singer" in absent_names(free["completion"], schema)
    held = generate(client, ddl=AIRLINES_DDL, constrained=True)
    assert held["constrained"] is True
    assert only_its_names(held["completion"], schema), held["completion"]
    assert "singer" not in held["completion"]


def test_a_schema_string_decodes_unconstrained_and_says_why(client):
    """A schema_str has no parsed names: the answer is the unconstrained one, byte for byte,
    and the body says it was not constrained and why."""
    text = RequestInput(SETTINGS, SPIDER_DIR).messages("x", db_id="flight_2")[1]["content"]
    schema_str = text.split("\n")[1]
    free = generate(client, schema_str=schema_str)
    held = generate(client, schema_str=schema_str, constrained=True)
    assert held["constrained"] is False
    assert held["unconstrained_reason"] == NO_PARSED_SCHEMA
    assert held["completion"] == free["completion"] and held["sql"] == free["sql"]


def test_the_servers_setting_is_the_default_a_request_overrides(trained, client, schemas):
    """--constrained: a request that says nothing is constrained, `"constrained": false` is
    not (and answers as a server without the setting); /health shows the setting."""
    app = create_app(serve_config(trained, constrained=True), prompt_settings=SETTINGS)
    with TestClient(app, base_url=LOCAL_URL) as held_client:
        assert held_client.get("/health").json()["constrained"] is True
        held = generate(held_client, db_id="flight_2")
        assert held["constrained"] is True
        assert only_its_names(held["completion"], schemas["flight_2"])
        free = generate(held_client, db_id="flight_2", constrained=False)
        assert "constrained" not in free
        plain = generate(client, db_id="flight_2")
        assert {**free, "usage": None} == {**plain, "usage": None}
    assert client.get("/health").json()["constrained"] is False


def test_the_openai_endpoint_takes_constrained_in_extra_body(client, schemas):
    free = chat(client, db_id="flight_2", max_tokens=24).json()
    assert "constrained" not in free["sqlrl"]
    held = chat(client, db_id="flight_2", max_tokens=24, constrained=True).json()
    assert held["sqlrl"]["constrained"] is True
    assert (
        held["choices"][0]["message"]["content"]
        == generate(client, db_id="flight_2", constrained=True)["sql"]
    )
    assert only_its_names(held["choices"][0]["message"]["content"], schemas["flight_2"])
    # the schema from a system message's CREATE TABLE statements, constrained the same way
    r = chat(client, AIRLINES_DDL, max_tokens=24, constrained=True)
    assert r.status_code == 200, r.text
    assert r.json()["sqlrl"]["constrained"] is True
    sql = r.json()["choices"][0]["message"]["content"]
    assert "singer" not in sql and only_its_names(sql, schema_from_ddl(AIRLINES_DDL))


def test_an_agent_model_refuses_constrained(trained, tmp_path, capsys):
    """The agent's query sits JSON-escaped inside a tool call, which the grammar does not
    cover: it is refused, per request and at start-up (--constrained), before the model loads."""
    from sqlrl.request_input import check_constrained_format
    from sqlrl.serve import cli

    with pytest.raises(ConstrainedFormatError, match="^constrained: .*'agent' format"):
        check_constrained_format("agent", "constrained")
    check_constrained_format("reasoning", "constrained")  # its answer span: the next test
    folder = tmp_path / "agent_model"
    folder.mkdir()
    recorded = json.loads((trained / "sqlrl_prompt.json").read_text())
    (folder / "sqlrl_prompt.json").write_text(json.dumps({**recorded, "rollout": "agent"}))
    assert cli.main(["--model", str(folder), "--constrained"]) == 2
    assert "'agent' format" in capsys.readouterr().err


def test_a_reasoning_model_is_held_to_its_answer_template(trained, schemas):
    """A reasoning model's completion is its thinking, then the query: each request's grammar
    is the one the format composes (`answer_grammar`: the thinking free, the answer span held
    to the schema), on both backends' `grammar_for`; the served request decodes under it."""
    from sqlrl.formats import get_format

    compose = get_format("reasoning").answer_grammar
    seen = []

    def grammar_for(schema, compose):
        seen.append((schema.db_id, compose('root ::= "SELECT 1"')))
        return "grammar"

    grammar = RequestInput(REASONING, SPIDER_DIR).grammar(grammar_for, db_id="flight_2")
    assert grammar == ("grammar", None)
    ((db, text),) = seen
    assert db == "flight_2" and '"<think>"' in text and "sql_root" in text
    assert RequestInput(SETTINGS, SPIDER_DIR).grammar(grammar_for, db_id="car_1")[0] == "grammar"
    assert seen[1][1] == 'root ::= "SELECT 1"'  # the sql format: the query grammar itself

    app = create_app(serve_config(trained), prompt_settings=REASONING)
    with TestClient(app, base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "flight_2", "constrained": True})
    assert r.status_code == 200 and r.json()["constrained"] is True, r.text
    assert matcher_for(schemas["flight_2"], compose).accept_string(r.json()["completion"])


def test_the_batcher_keeps_each_requests_grammar(trained, schemas):
    """Three requests in one batch of the transformers backend: one unconstrained, two under
    different databases' grammars. Each row is held to its own grammar, and the unconstrained
    row is what the same batch writes without any grammar, token for token."""
    from sqlrl.data.prompts import render_prompt
    from sqlrl.serve.backends import BackendOptions, make_backend

    backend = make_backend(
        trained, BackendOptions(backend="transformers", batch_wait_s=0.5, torch_threads=1)
    )
    prompts = RequestInput(SETTINGS, SPIDER_DIR)
    dbs = ("flight_2", "flight_2", "car_1")
    texts = [render_prompt(backend.tokenizer, prompts.messages(Q, db_id=db)) for db in dbs]
    grammars = [None] + [backend.grammar_for(schemas[db]) for db in dbs[1:]]

    async def batch(with_grammars):
        await backend.start()
        try:
            return await asyncio.gather(
                *(
                    backend.complete(t, max_new_tokens=24, grammar=g if with_grammars else None)
                    for t, g in zip(texts, grammars, strict=True)
                )
            )
        finally:
            await backend.close()

    [free], [flights], [cars] = asyncio.run(batch(True))
    assert backend.stats.batches == 1 and backend.stats.largest_batch == 3
    plain = asyncio.run(batch(False))
    assert backend.stats.batches == 2 and backend.stats.largest_batch == 3
    assert free == plain[0][0] and "singer" in absent_names(free, schemas["flight_2"])
    assert only_its_names(flights, schemas["flight_2"]), flights
    assert only_its_names(cars, schemas["car_1"]), cars
    assert flights != cars  # each row had its own grammar, not the batch's first


def test_text_to_sql_constrained(trained, tmp_path, schemas):
    """`TextToSQL(model, constrained=...)` and per call `constrained=`: the Answer says whether
    it was constrained; a schema string falls back with the reason; an agent model is
    refused before it loads."""
    from sqlrl.text_to_sql import TextToSQL

    t = TextToSQL(trained, spider_dir=SPIDER_DIR, max_new_tokens=24)
    free = t.answer(Q, db="flight_2")
    assert free.constrained is None and "singer" in absent_names(
        free.completion, schemas["flight_2"]
    )
    held = t.answer(Q, db="flight_2", constrained=True)
    assert held.constrained is True and held.unconstrained_reason is None
    assert only_its_names(held.completion, schemas["flight_2"]), held.completion
    assert t(Q, db="flight_2", constrained=True) == held.sql
    on = TextToSQL(trained, spider_dir=SPIDER_DIR, max_new_tokens=24, constrained=True)
    assert on(Q, db="flight_2") == held.sql
    assert on.answer(Q, db="flight_2", constrained=False).completion == free.completion
    ddl = on.answer(Q, ddl=AIRLINES_DDL)
    assert ddl.constrained is True
    assert only_its_names(ddl.completion, schema_from_ddl(AIRLINES_DDL)), ddl.completion
    text = RequestInput(SETTINGS, SPIDER_DIR).messages("x", db_id="flight_2")[1]["content"]
    loose = on.answer(Q, schema=text.split("\n")[1])
    assert loose.constrained is False and loose.unconstrained_reason == NO_PARSED_SCHEMA
    folder = tmp_path / "reasoning_model"
    folder.mkdir()
    recorded = json.loads((trained / "sqlrl_prompt.json").read_text())
    (folder / "sqlrl_prompt.json").write_text(json.dumps({**recorded, "rollout": "agent"}))
    with pytest.raises(ConstrainedFormatError, match="'agent' format"):
        TextToSQL(folder, spider_dir=SPIDER_DIR, constrained=True)


def structured(params) -> list:
    """The structured_outputs of each prompt's SamplingParams in one engine call (LLM takes
    one for all prompts or a list of one per prompt; AsyncLLMEngine one per request)."""
    return [p.structured_outputs for p in (params if isinstance(params, list) else [params])]


@pytest.mark.parametrize("with_async", [True, False])
def test_the_vllm_backends_send_the_grammar_text(monkeypatch, trained, schemas, with_async):
    """AsyncLLMEngine and LLM (behind the batcher): a constrained request's SamplingParams
    carry its database's grammar text (StructuredOutputsParams(grammar=...)); an
    unconstrained one's, and a schema_str one's, have no structured_outputs."""
    vllm = vllm_package([COUNT_SQL], with_async)
    install(monkeypatch, vllm)
    app = create_app(serve_config(trained, backend="vllm"), prompt_settings=SETTINGS)
    text = RequestInput(SETTINGS, SPIDER_DIR).messages("x", db_id="flight_2")[1]["content"]
    with TestClient(app, base_url=LOCAL_URL) as c:
        assert c.get("/health").json()["backend"] == ("vllm-async" if with_async else "vllm")
        assert "constrained" not in generate(c, db_id="flight_2")
        assert generate(c, db_id="flight_2", constrained=True)["constrained"] is True
        loose = generate(c, schema_str=text.split("\n")[1], constrained=True)
        assert loose["constrained"] is False
    free, held, plain = (structured(p) for p in sent(vllm))
    assert free == [None] and plain == [None]
    assert [s.grammar for s in held] == [grammar_text(schemas["flight_2"])]


def test_the_vllm_batcher_sends_one_sampling_params_per_prompt(monkeypatch, trained, schemas):
    """LLM behind the batcher: a batch of a constrained and an unconstrained request is one
    LLM.generate call with a list of SamplingParams, the grammar on the constrained row only;
    a batch without a grammar sends the one SamplingParams as before."""
    from sqlrl.serve.backends import BackendOptions, make_backend

    vllm = vllm_package([COUNT_SQL], with_async=False)
    install(monkeypatch, vllm)
    backend = make_backend(trained, BackendOptions(backend="vllm", batch_wait_s=0.5))
    grammar = backend.grammar_for(schemas["flight_2"])

    async def batch(*grammars):
        await backend.start()
        try:
            return await asyncio.gather(*(backend.complete("p", grammar=g) for g in grammars))
        finally:
            await backend.close()

    assert asyncio.run(batch(None, grammar)) == [[COUNT_SQL], [COUNT_SQL]]
    assert asyncio.run(batch(None, None)) == [[COUNT_SQL], [COUNT_SQL]]
    mixed, plain = sent(vllm)
    assert isinstance(mixed, list) and not isinstance(plain, list)
    assert [s and s.grammar for s in structured(mixed)] == [None, grammar]
    assert plain.structured_outputs is None
