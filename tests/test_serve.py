"""The HTTP service (sqlrl/serve): a tiny model trained in the fixture, served by FastAPI.

The fixture trains a tiny Qwen2 model for a few seconds until it reproduces
`SELECT count(*) FROM singer` / `SELECT Name FROM stadium` for prompts built by the server's own
prompt builder on Spider's concert_singer, so the tests see real model output. vLLM is never
installed here: its paths run against a stand-in module in sys.modules.
"""
from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import types

import pytest
import torch

from sqlrl.paths import SPIDER_DIR
from sqlrl.serve import PromptSettings, ServeConfig, create_app, schema_from_ddl
from sqlrl.serve.backends import BackendOptions, BatchingBackend, Busy, make_backend
from sqlrl.serve.prompting import PromptBuilder

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TestClient = fastapi_testclient.TestClient

SETTINGS = PromptSettings("compact", 0, "You are a text-to-SQL assistant.")
COUNT_SQL = "SELECT count(*) FROM singer"
NAME_SQL = "SELECT Name FROM stadium"
PAIRS = [("How many singers do we have?", COUNT_SQL),
         ("What is the total number of singers?", COUNT_SQL),
         ("Count the singers.", COUNT_SQL),
         ("List the names of all stadiums.", NAME_SQL),
         ("What are the stadium names?", NAME_SQL),
         ("Show every stadium name.", NAME_SQL)]
CONCERT_DDL = """
CREATE TABLE stadium (Stadium_ID INT PRIMARY KEY, Location TEXT, Name TEXT, Capacity INT,
  Highest INT, Lowest INT, Average INT);
CREATE TABLE singer (Singer_ID INT, Name TEXT, Country TEXT, Song_Name TEXT,
  Song_release_year TEXT, Age INT, Is_male BOOLEAN, PRIMARY KEY (Singer_ID));
CREATE TABLE concert (concert_ID INT PRIMARY KEY, concert_Name TEXT, Theme TEXT,
  Stadium_ID TEXT REFERENCES stadium(Stadium_ID), Year TEXT);
CREATE TABLE singer_in_concert (concert_ID INT, Singer_ID TEXT,
  PRIMARY KEY (concert_ID, Singer_ID),
  FOREIGN KEY (concert_ID) REFERENCES concert(concert_ID),
  FOREIGN KEY (Singer_ID) REFERENCES singer(Singer_ID));
CREATE INDEX ignored ON singer(Name);
"""


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained until it answers PAIRS exactly (greedy), saved like models/final."""
    from sqlrl.modeling import build_scratch_model, to_transformers_tokenizer, train_tokenizer
    from sqlrl.params import ArchitectureParams
    from sqlrl.prompts import render_prompt

    builder = PromptBuilder(SETTINGS, SPIDER_DIR)
    messages = [builder.messages(q, db_id="concert_singer") for q, _ in PAIRS]
    texts = [m["content"] for ms in messages for m in ms] + [sql for _, sql in PAIRS]
    arch = ArchitectureParams(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=512, vocab_size=400)
    tokenizer = to_transformers_tokenizer(train_tokenizer(texts * 5, arch.vocab_size))
    model = build_scratch_model(arch, tokenizer, seed=0)
    seqs = [(tokenizer(render_prompt(tokenizer, m), add_special_tokens=False)["input_ids"],
             tokenizer(sql + "<|im_end|>", add_special_tokens=False)["input_ids"])
            for m, (_, sql) in zip(messages, PAIRS)]
    width = max(len(a) + len(b) for a, b in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (a, b) in enumerate(seqs):
        ids[i, :len(a) + len(b)] = torch.tensor(a + b)
        mask[i, :len(a) + len(b)] = 1
        labels[i, len(a):len(a) + len(b)] = torch.tensor(b)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and robust on a busy CPU
    try:
        exact_steps = _train(model, optimizer, ids, mask, labels)
    finally:
        torch.set_num_threads(threads)
    assert exact_steps >= 3, "the fixture model did not learn its completions"
    path = tmp_path_factory.mktemp("served_model")
    model.eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _train(model, optimizer, ids, mask, labels) -> int:
    """Full-weight steps until every completion token is the argmax three steps running."""
    exact_steps = 0
    for _ in range(300):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        pred, target = out.logits[:, :-1].argmax(-1), labels[:, 1:]
        scored = target != -100
        exact_steps = exact_steps + 1 if bool((pred[scored] == target[scored]).all()) else 0
        if exact_steps >= 3:  # every completion token is the argmax, with a margin
            break
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    return exact_steps


def _config(model_dir, **kw) -> ServeConfig:
    base = dict(model=str(model_dir), spider_dir=str(SPIDER_DIR), max_new_tokens=24,
                max_batch_size=8, request_timeout_s=60.0, warmup=False)
    return ServeConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def client(trained):
    app = create_app(_config(trained), prompt_settings=SETTINGS)
    with TestClient(app) as c:
        yield c


# --------------------------------------------------------------------------- generation

def test_generate_returns_the_trained_sql_for_every_schema_form(client):
    schema_text = PromptBuilder(SETTINGS, SPIDER_DIR).messages(
        "x", db_id="concert_singer")[1]["content"].split("\n")[1]
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
    r = client.post("/generate", json={"question": "How many singers are there in total?",
                                       "db_id": "concert_singer", "max_new_tokens": 12})
    assert r.status_code == 200 and r.json()["sql"].startswith("SELECT")


def test_ddl_prompt_equals_the_training_prompt():
    builder = PromptBuilder(SETTINGS, SPIDER_DIR)
    assert builder.messages("Q?", ddl=CONCERT_DDL) == builder.messages("Q?", db_id="concert_singer")
    ddl_settings = PromptSettings("ddl", 0, "sys")
    ddl_builder = PromptBuilder(ddl_settings, SPIDER_DIR)
    schema = schema_from_ddl(CONCERT_DDL)
    assert [t.name for t in schema.tables] == ["stadium", "singer", "concert",
                                               "singer_in_concert"]
    singer = schema.tables[1]
    assert [(c.name, c.type, c.is_primary) for c in singer.columns][:2] == [
        ("Singer_ID", "number", True), ("Name", "text", False)]
    assert singer.columns[-1].type == "boolean"
    assert {(f.table, f.column, f.ref_table, f.ref_column) for f in schema.foreign_keys} == {
        ("concert", "Stadium_ID", "stadium", "Stadium_ID"),
        ("singer_in_concert", "concert_ID", "concert", "concert_ID"),
        ("singer_in_concert", "Singer_ID", "singer", "Singer_ID")}
    text = ddl_builder.messages("Q?", ddl=CONCERT_DDL)[1]["content"]
    assert "PRIMARY KEY (concert_ID, Singer_ID)" in text
    assert "FOREIGN KEY (Singer_ID) REFERENCES singer(Singer_ID)" in text


def test_default_prompt_settings_come_from_params_yaml(prepared_dir):
    from sqlrl.evaluate import read_jsonl
    from sqlrl.params import load_params

    prep = load_params().prepare
    settings = PromptSettings.from_params()
    assert (settings.schema_format, settings.sample_rows, settings.system_prompt) == (
        prep.schema_format, prep.sample_rows, prep.system_prompt)
    assert settings.schema_repair == load_params().eval.schema_repair
    assert PromptSettings.from_params(schema_format="ddl").schema_format == "ddl"
    rows = [r for r in read_jsonl(prepared_dir / "dev.jsonl")[:50] if r.get("prompt")]
    builder = PromptBuilder(settings, SPIDER_DIR)
    for row in rows[:5]:  # served prompts are the prompts the model was evaluated on
        assert builder.messages(row["question"], db_id=row["db_id"]) == row["prompt"]


def test_execute_runs_the_sql_on_the_real_spider_database(client):
    r = client.post("/generate", json={"question": PAIRS[0][0], "db_id": "concert_singer",
                                       "execute": True})
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["sql"] == COUNT_SQL and body["verdict"] == {"status": "ok", "error": ""}
    assert body["columns"] == ["count(*)"] and body["rows"] == [[6]]
    assert body["truncated"] is False
    r = client.post("/generate", json={"question": PAIRS[3][0], "db_id": "concert_singer",
                                       "execute": True, "max_rows": 2})
    body = r.json()
    assert body["sql"] == NAME_SQL and len(body["rows"]) == 2 and body["truncated"] is True


def test_num_samples_votes_by_execution(client):
    r = client.post("/generate", json={"question": PAIRS[0][0], "db_id": "concert_singer",
                                       "execute": True, "num_samples": 4, "temperature": 0.3,
                                       "seed": 3})
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["num_samples"] == 4 and len(body["candidates"]) == 4
    assert body["vote"] == "execution" and body["votes"] >= 1
    assert body["sql"] in body["candidates"] and body["rows"] == [[6]]
    r = client.post("/generate", json={"question": PAIRS[0][0], "db_id": "concert_singer",
                                       "num_samples": 2})  # no execution: the commonest text
    assert r.status_code == 200 and r.json()["vote"] == "sql_text"


def test_health_models_and_databases(client, trained):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model_loaded"] is True
    assert health["backend"] == "transformers" and health["model"] == str(trained)
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
    ({"question": Q, "db_id": "concert_singer", "ddl": "CREATE TABLE t (a)"}, 422,
     "got db_id, ddl"),
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
    ({"question": Q, "db_id": "concert_singer", "max_new_tokens": 100000}, 422,
     "max_new_tokens must be between 1 and 512"),
    ({"question": Q, "db_id": "concert_singer", "temperature": 9.0}, 422, "temperature must"),
    ({"question": Q, "db_id": "concert_singer", "num_samples": 99, "temperature": 1.0}, 422,
     "num_samples must be between 1 and 16"),
    ({"question": Q, "db_id": "concert_singer", "num_samples": 2, "temperature": 0}, 422,
     "needs a temperature > 0"),
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
        r = client.post("/generate", content=data)
        assert r.status_code == status, (data[:40], r.text)
        assert fragment in r.json()["detail"]
    r = client.post("/generate", json={"question": Q, "db_id": "concert_singer"})
    assert r.status_code == 200 and r.json()["sql"] == COUNT_SQL


# --------------------------------------------------------------------------- failures

class _ScriptedGenerator:
    """A Generator double: waits, fails or answers, as told."""

    def __init__(self, delay: float = 0.0, error: Exception | None = None,
                 text: str = "SELECT 1"):
        self.delay, self.error, self.text = delay, error, text
        self.calls: list[int] = []
        self.release = threading.Event()

    def generate(self, prompts):
        self.calls.append(len(prompts))
        if self.delay:
            self.release.wait(self.delay)
        if self.error:
            raise self.error
        return [self.text] * len(prompts)

    def sample(self, prompts, n, temperature, seed):
        return [[self.text] * n for _ in self.generate(prompts)]


@pytest.fixture(scope="module")
def tokenizer(trained):
    from sqlrl.modeling import load_tokenizer
    return load_tokenizer(trained)


def _scripted_app(trained, tokenizer, generator, **kw):
    backend = BatchingBackend(generator, tokenizer, name="scripted", model_path=str(trained),
                              max_batch_size=kw.pop("max_batch_size", 8),
                              max_queue=kw.pop("max_queue", 16))
    settings = kw.pop("prompt_settings", SETTINGS)
    return create_app(_config(trained, **kw), backend=backend, prompt_settings=settings)


def test_schema_repair_maps_unknown_names_where_the_schema_is_known(trained, tokenizer):
    """A model that writes another database's table: repaired for db_id and ddl requests."""
    memorised = _ScriptedGenerator(text="SELECT count(*) FROM performance")
    repair = PromptSettings("compact", 0, "You are a text-to-SQL assistant.",
                            schema_repair=True)
    with TestClient(_scripted_app(trained, tokenizer, memorised, prompt_settings=repair)) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer",
                                      "execute": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["sql"] == "SELECT COUNT(*) FROM singer" and body["rows"] == [[6]]
        assert body["completion"] == "SELECT count(*) FROM performance"
        r = c.post("/generate", json={"question": Q, "ddl": CONCERT_DDL})
        assert r.json()["sql"] == "SELECT COUNT(*) FROM singer"
        r = c.post("/generate", json={"question": Q, "schema_str": "singer | Name, Age"})
        assert r.json()["sql"] == "SELECT count(*) FROM performance"  # free text: no names
    with TestClient(_scripted_app(trained, tokenizer, memorised)) as c:  # repair off
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.json()["sql"] == "SELECT count(*) FROM performance"


def test_a_hung_generation_times_out_with_504_and_a_failure_is_a_500(trained, tokenizer):
    slow = _ScriptedGenerator(delay=30.0)
    with TestClient(_scripted_app(trained, tokenizer, slow, request_timeout_s=0.3)) as c:
        t0 = time.monotonic()
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 504 and "did not finish within 0.3 s" in r.json()["detail"]
        assert time.monotonic() - t0 < 5
        assert c.get("/health").status_code == 200  # still serving
        slow.release.set()
    broken = _ScriptedGenerator(error=RuntimeError("CUDA out of memory"))
    with TestClient(_scripted_app(trained, tokenizer, broken)) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 500
        assert r.json()["detail"] == "generation failed: RuntimeError: CUDA out of memory"
        broken.error = None  # the next batch works again
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 200 and r.json()["sql"] == "SELECT 1"


def test_the_batcher_groups_concurrent_requests_and_refuses_beyond_its_queue(tokenizer):
    async def scenario():
        gen = _ScriptedGenerator(delay=0.3)
        backend = BatchingBackend(gen, tokenizer, name="t", model_path="m",
                                  max_batch_size=4, batch_wait_s=0.05, max_queue=6)
        await backend.start()
        try:
            first = asyncio.ensure_future(backend.complete("p0"))
            await asyncio.sleep(0.1)  # p0 is in the model; the next ones queue up
            rest = [asyncio.ensure_future(backend.complete(f"p{i}")) for i in range(1, 7)]
            await asyncio.sleep(0.01)  # all six are queued
            with pytest.raises(Busy):
                await backend.complete("one too many")
            gen.release.set()
            results = await asyncio.gather(first, *rest)
        finally:
            await backend.close()
        return gen.calls, results

    calls, results = asyncio.run(scenario())
    assert results == [["SELECT 1"]] * 7
    assert calls == [1, 4, 2]  # batches of at most max_batch_size, in arrival order


# --------------------------------------------------------------------------- vLLM stand-in

def _fake_vllm(with_async: bool, fail: bool = False):
    vllm = types.ModuleType("vllm")
    vllm.calls = []

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class _Completion:
        def __init__(self, text):
            self.text = text

    class _Output:
        def __init__(self, n):
            self.outputs = [_Completion("```sql\nSELECT count(*) FROM singer;\n```")] * n

    class LLM:
        def __init__(self, **kw):
            if fail:
                raise RuntimeError("no CUDA device")
            vllm.calls.append(("LLM", kw))

        def generate(self, prompts, params):
            vllm.calls.append(("generate", len(prompts), params.kw))
            return [_Output(params.kw["n"]) for _ in prompts]

    vllm.SamplingParams, vllm.LLM = SamplingParams, LLM
    if with_async:
        class AsyncEngineArgs:
            def __init__(self, **kw):
                self.kw = kw

        class AsyncLLMEngine:
            @classmethod
            def from_engine_args(cls, args):
                vllm.calls.append(("AsyncLLMEngine", args.kw))
                return cls()

            async def generate(self, prompt, params, request_id):
                vllm.calls.append(("agenerate", request_id, params.kw))
                yield _Output(params.kw["n"])

        vllm.AsyncEngineArgs, vllm.AsyncLLMEngine = AsyncEngineArgs, AsyncLLMEngine
    return vllm


@pytest.mark.parametrize("with_async", [True, False])
def test_vllm_backend_with_a_stand_in_module(monkeypatch, trained, with_async):
    vllm = _fake_vllm(with_async)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    app = create_app(_config(trained, backend="vllm"), prompt_settings=SETTINGS)
    with TestClient(app) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer",
                                      "execute": True, "num_samples": 2})
        assert r.status_code == 200, r.text
        assert r.json()["sql"] == COUNT_SQL and r.json()["rows"] == [[6]]
        health = c.get("/health").json()
    assert health["backend"] == ("vllm-async" if with_async else "vllm")
    engine = [call for call in vllm.calls if call[0] in ("LLM", "AsyncLLMEngine")]
    assert engine and engine[0][1]["model"] == str(trained)
    generated = [call for call in vllm.calls if call[0] in ("generate", "agenerate")]
    params = generated[-1][-1]
    assert params["n"] == 2 and params["temperature"] == 0.8 and params["stop_token_ids"]


def test_vllm_that_cannot_start_falls_back_to_transformers(monkeypatch, trained, capsys):
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(with_async=False, fail=True))
    backend = make_backend(trained, BackendOptions(backend="auto"))
    assert backend.name == "transformers"
    assert "vLLM could not start" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "vllm", None)  # not installed
    assert make_backend(trained, BackendOptions(backend="vllm")).name == "transformers"


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
    import uvicorn

    app = create_app(_config(trained, max_batch_size=8, batch_wait_ms=5),
                     prompt_settings=SETTINGS)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"

        async def burst():
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                bodies = [{"question": PAIRS[i % len(PAIRS)][0], "db_id": "concert_singer",
                           "execute": i % 2 == 0} for i in range(32)]
                return await asyncio.gather(*(http.post("/generate", json=b) for b in bodies))

        responses = asyncio.run(burst())
        assert [r.status_code for r in responses] == [200] * 32
        assert [r.json()["sql"] for r in responses] == [PAIRS[i % len(PAIRS)][1]
                                                         for i in range(32)]
        assert responses[0].json()["rows"] == [[6]]
        health = httpx.get(base + "/health", timeout=10).json()
        batching = health["batching"]
        assert batching["requests"] == 32 and batching["largest_batch"] > 1  # batched
        assert batching["batches"] < 32
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()
