"""Generation backends of the server (sqlrl/serve/backends.py): the micro-batcher, the vLLM
backends against a stand-in `vllm` package in sys.modules (vLLM is never installed here; the
real engine: tests/serve/test_vllm.py, `pytest -m vllm`), and decoding that takes nothing from
the checkpoint's generation_config.json."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
import torch
from fastapi.testclient import TestClient  # a hard dependency: never skip these tests

from sqlrl.request_input import RequestInput
from sqlrl.serve import create_app
from sqlrl.serve.backends import BackendOptions, BatchingBackend, Busy, make_backend
from tests.serve_helpers import (
    COUNT_SQL,
    LOCAL_URL,
    SETTINGS,
    Q,
    ScriptedGenerator,
    save_prompt_settings,
    serve_config,
    served_arch,
)
from tests.vllm_stand_in import RequestOutputKind, SamplingParams, install, sent, vllm_package


def test_the_batcher_groups_concurrent_requests_and_refuses_beyond_its_queue(tokenizer):
    async def until(condition):
        for _ in range(3000):  # a guard against hanging (30 s), not a speed target
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out waiting")

    async def scenario():
        gen = ScriptedGenerator(delay=60.0)  # holds the model until released
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


# --------------------------------------------------------------------------- vLLM stand-in
# (tests/vllm_stand_in.py: vLLM 0.32 as its source has it)

COUNT_ANSWER = "```sql\nSELECT count(*) FROM singer;\n```"


@pytest.mark.parametrize("with_async", [True, False])
def test_vllm_backend_with_a_stand_in_module(monkeypatch, trained, with_async):
    vllm = vllm_package([COUNT_ANSWER], with_async)
    install(monkeypatch, vllm)
    app = create_app(serve_config(trained, backend="vllm"), prompt_settings=SETTINGS)
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
    params = sent(vllm)[-1].kw
    assert params["n"] == 2 and params["temperature"] == 0.8 and params["stop_token_ids"]


def test_vllm_async_votes_over_every_sample_it_asked_for(monkeypatch, trained):
    """The engine streams one sample per output by default; the server still votes over
    all num_samples (three right answers outvote one wrong one that finishes last)."""
    wrong = "SELECT Name FROM singer WHERE Age > 100 ORDER BY Name DESC"
    vllm = vllm_package([COUNT_SQL, COUNT_SQL, COUNT_SQL, wrong])
    install(monkeypatch, vllm)

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
        create_app(serve_config(trained, backend="vllm"), prompt_settings=SETTINGS),
        base_url=LOCAL_URL,
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
    vllm = vllm_package([COUNT_ANSWER], with_async)
    install(monkeypatch, vllm)
    schema = "\n".join(f"table_{i} | id, name_{i}, value_{i}" for i in range(150))
    config = serve_config(trained, backend="vllm", max_prompt_tokens=max_prompt_tokens)
    with TestClient(create_app(config, prompt_settings=SETTINGS), base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "schema_str": schema})
        assert r.status_code == 413, r.text
        assert "the model's context of 512 tokens minus max_new_tokens 24" in r.json()["detail"]
        assert sent(vllm) == []  # refused before the engine
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 200 and r.json()["sql"] == COUNT_SQL


def test_vllm_that_cannot_start_falls_back_to_transformers(monkeypatch, trained, caplog):
    install(monkeypatch, vllm_package([COUNT_ANSWER], with_async=False, fail=True))
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

    arch = served_arch()
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
    save_prompt_settings(path, SETTINGS)
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
    with TestClient(
        create_app(serve_config(penalised, max_new_tokens=16)), base_url=LOCAL_URL
    ) as c:
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
    vllm = vllm_package([COUNT_ANSWER], with_async)
    install(monkeypatch, vllm)
    with TestClient(create_app(serve_config(penalised, backend="vllm")), base_url=LOCAL_URL) as c:
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
    greedy, sampled = (params.kw for params in sent(vllm))
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
