"""Batched generation backends (sqlrl/model/generate.py) on a tiny Qwen2 model built in the test."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from sqlrl.data.prompts import render_prompt
from sqlrl.model import generate as gen
from sqlrl.model.modeling import (
    IM_END,
)
from tests.vllm_stand_in import SAMPLING_DEFAULTS, SamplingParams


def test_batched_generation_equals_one_at_a_time_and_keeps_order(tiny, prompts):
    model, tokenizer, _ = tiny
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    assert len(set(lengths)) > 2  # left padding is really exercised
    batched = gen.HFGenerator(model, tokenizer, batch_size=3, max_new_tokens=12, progress=False)
    single = gen.HFGenerator(model, tokenizer, batch_size=1, max_new_tokens=12, progress=False)
    ids = batched.generate_ids(prompts)
    assert ids == [single.generate_ids([p])[0] for p in prompts]
    assert len({tuple(x) for x in ids}) > 1  # different prompts, different completions
    texts = batched.generate(prompts)
    assert texts == [tokenizer.decode(x, skip_special_tokens=True) for x in ids]
    # order: the outputs follow the prompts, whatever order they were batched in
    assert batched.generate(prompts[::-1]) == texts[::-1]
    assert batched.generate([]) == []


def test_generation_stops_at_eos_and_cuts_at_max_new_tokens(tiny, prompts):
    model, tokenizer, _ = tiny
    free = gen.HFGenerator(model, tokenizer, batch_size=5, max_new_tokens=20, progress=False)
    unconstrained = free.generate_ids(prompts)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    assert im_end in free.stop_ids and tokenizer.eos_token_id in free.stop_ids
    assert all(len(x) <= 20 for x in unconstrained)
    assert all(im_end not in x for x in unconstrained)

    calls = []

    def force_eos_at_step_4(module, args, output):  # <|im_end|> wins the 4th decoding step
        calls.append(1)
        if len(calls) == 4:
            output = output.clone()
            output[..., im_end] = 1e4
        return output

    handle = model.lm_head.register_forward_hook(force_eos_at_step_4)
    try:
        stopped = free.generate_ids(prompts)
    finally:
        handle.remove()
    assert len(calls) == 4  # generation ended at EOS, long before max_new_tokens
    assert stopped == [x[:3] for x in unconstrained]

    short = gen.HFGenerator(model, tokenizer, batch_size=2, max_new_tokens=5, progress=False)
    assert short.generate_ids(prompts) == [x[:5] for x in unconstrained]


def test_cut_at_stop_and_length_order():
    assert gen.cut_at_stop([5, 6, 2, 0, 0], [2, 0]) == [5, 6]
    assert gen.cut_at_stop([5, 6, 7], [2], max_new_tokens=2) == [5, 6]
    assert gen.cut_at_stop([2, 5], [2]) == []
    assert gen.length_order([3, 9, 3, 5]) == [1, 3, 0, 2]


def test_sampling_is_seeded_and_returns_n_per_prompt(tiny, prompts):
    model, tokenizer, _ = tiny
    g = gen.HFGenerator(model, tokenizer, batch_size=2, max_new_tokens=8, progress=False)
    first = g.sample(prompts, n=3, temperature=1.0, seed=7)
    assert [len(group) for group in first] == [3] * len(prompts)
    assert g.sample(prompts, n=3, temperature=1.0, seed=7) == first
    assert len({s for group in first for s in group}) > len(prompts)  # it really samples
    with pytest.raises(ValueError):
        g.generate_ids(prompts, n=2, temperature=0.0)


def test_shared_prefix_generation_draws_the_same_tokens_as_generate(tiny, prompts):
    """A batch of repeated prompts (runs of unequal length, left padding) prefilled once per
    prompt samples exactly what plain generate samples from the same seed."""
    from transformers import GenerationConfig, set_seed

    model, tokenizer, _ = tiny
    g = gen.HFGenerator(model, tokenizer, batch_size=8, max_new_tokens=12, progress=False)
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts[:3]]
    ids, mask = g._left_pad([encoded[0]] * 3 + [encoded[1]] + [encoded[2]] * 4)
    assert gen.repeated_rows(ids, mask) == ([0, 3, 4], [3, 1, 4])
    config = GenerationConfig(
        max_new_tokens=12,
        eos_token_id=g.stop_ids,
        pad_token_id=g.pad_id,
        **gen.hf_decoding_settings(1.0),
    )
    set_seed(3)
    plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    set_seed(3)
    shared = gen.shared_prefix_generate(model, ids, mask, config)
    assert torch.equal(shared, plain)
    assert len({tuple(row) for row in plain[:3, ids.shape[1] :].tolist()}) > 1  # it samples


# --------------------------------------------------------------------------- checkpoint defaults

# What a Qwen2.5 instruct checkpoint's generation_config.json does to unset settings, made
# stronger so that any leak changes the output
HOSTILE = {
    "do_sample": True,
    "temperature": 0.7,
    "top_k": 5,
    "top_p": 0.5,
    "repetition_penalty": 1.3,
    "min_p": 0.3,
    "no_repeat_ngram_size": 2,
}


def _reference_decode(model, tokenizer, prompt, stop_ids, max_new_tokens, temperature=0.0):
    """The reference decoder: argmax of the raw logits, or a draw from softmax(logits / T),
    one full forward pass per token (no cache, no padding, no processors)."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    out = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids + out])).logits[0, -1].float()
            if temperature > 0.0:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probs[None], num_samples=1)[0, 0])
            else:
                token = int(logits.argmax())
            if token in stop_ids:
                break
            out.append(token)
    return out


@pytest.fixture(scope="module")
def hostile(tiny, prompts, tmp_path_factory):
    """The tiny model saved with a generation_config.json that sets Qwen-style sampling
    defaults, a strong repetition penalty, and suppresses the tokens greedy decoding picks
    first (a setting whose "off" is unset): (model, tokenizer, path, stop ids)."""
    from transformers import AutoModelForCausalLM

    model, tokenizer, path = tiny
    stops = gen.stop_token_ids(tokenizer, model)
    firsts = sorted({_reference_decode(model, tokenizer, p, stops, 1)[0] for p in prompts})
    folder = tmp_path_factory.mktemp("hostile")
    shutil.copytree(path, folder, dirs_exist_ok=True)
    config = json.loads((folder / "generation_config.json").read_text())
    config.update(HOSTILE, suppress_tokens=firsts)
    (folder / "generation_config.json").write_text(json.dumps(config))
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert loaded.generation_config.repetition_penalty == 1.3  # the checkpoint really says so
    assert loaded.generation_config.suppress_tokens == firsts
    return loaded, tokenizer, folder, stops


def test_greedy_is_argmax_whatever_the_checkpoint_generation_config_says(hostile, prompts):
    model, tokenizer, _, stops = hostile
    g = gen.HFGenerator(model, tokenizer, batch_size=3, max_new_tokens=10, progress=False)
    expected = [_reference_decode(model, tokenizer, p, stops, 10) for p in prompts]
    assert g.generate_ids(prompts) == expected
    assert g.generate(prompts) == [tokenizer.decode(x, skip_special_tokens=True) for x in expected]
    # the model's own generation_config is back after the call (it is saved with the model)
    assert model.generation_config.repetition_penalty == 1.3


def test_sampling_is_temperature_only_whatever_the_checkpoint_says(hostile, prompts):
    from transformers import set_seed

    model, tokenizer, _, stops = hostile
    g = gen.HFGenerator(model, tokenizer, batch_size=1, max_new_tokens=10, progress=False)
    for k, prompt in enumerate(prompts[:3]):
        (drawn,) = g.generate_ids([prompt], n=1, temperature=1.5, seed=100 + k)
        set_seed(100 + k)  # the same draws, from the reference decoder
        assert drawn == _reference_decode(model, tokenizer, prompt, stops, 10, temperature=1.5)


# --------------------------------------------------------------------------- vLLM stand-in

# the fields that decide which tokens come out, and when decoding stops
VLLM_DECODING_FIELDS = {
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "bad_words",
    "logit_bias",
    "allowed_token_ids",
    "structured_outputs",
    "repetition_detection",
    "thinking_token_budget",
    "trace_decode_token_ids",
    "watermarking",
    "include_stop_str_in_output",
    "skip_special_tokens",
}
# ModelConfig.get_diff_sampling_param: what vLLM takes from generation_config.json
VLLM_FROM_CHECKPOINT = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)


class _FakeLLM:
    """vllm.LLM's constructor and generate(prompts, sampling_params=None); with
    generation_config "auto" (the default) requests without SamplingParams take the
    checkpoint's settings, as LLM.get_default_sampling_params does."""

    instances: list = []
    answers: dict = {}  # prompt -> completions; otherwise "SELECT <len(prompt)> -- <k>"
    ENGINE_ARGS = {
        "generation_config",
        "override_generation_config",
        "max_model_len",
        "gpu_memory_utilization",
        "enforce_eager",
    }  # a few of EngineArgs' fields

    def __init__(self, model, *, tokenizer=None, dtype="auto", seed=0, **kwargs):
        if set(kwargs) - self.ENGINE_ARGS:
            raise TypeError(f"unexpected engine arguments {sorted(set(kwargs) - self.ENGINE_ARGS)}")
        self.kwargs = dict(kwargs, model=model, tokenizer=tokenizer, dtype=dtype, seed=seed)
        self.calls = []
        _FakeLLM.instances.append(self)

    def get_default_sampling_params(self):
        source = self.kwargs.get("generation_config", "auto")
        path = Path(self.kwargs["model"]) / "generation_config.json"
        config = {} if source == "vllm" or not path.is_file() else json.loads(path.read_text())
        config.update(self.kwargs.get("override_generation_config") or {})
        diff = {k: config[k] for k in VLLM_FROM_CHECKPOINT if config.get(k) is not None}
        if "max_new_tokens" in diff:
            diff["max_tokens"] = diff.pop("max_new_tokens")
        return SamplingParams(**diff)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None):
        sampling_params = sampling_params or self.get_default_sampling_params()
        self.calls.append((list(prompts), sampling_params))
        n = sampling_params.n
        texts = {
            p: self.answers.get(p) or [f"SELECT {len(p)} -- {k}" for k in range(n)] for p in prompts
        }
        return [
            types.SimpleNamespace(
                prompt=p,
                outputs=[types.SimpleNamespace(index=k, text=texts[p][k]) for k in range(n)],
            )
            for p in prompts
        ]


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = _FakeLLM, SamplingParams
    _FakeLLM.instances.clear()
    _FakeLLM.answers = {}
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_vllm_absent_falls_back_to_transformers(tiny, prompts, monkeypatch, caplog):
    """The same greedy completions as transformers gives, with a line saying why."""
    model, tokenizer, path = tiny
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    assert not gen.vllm_available()
    generator, loaded = gen.make_generator(
        path, use_vllm=True, batch_size=4, max_new_tokens=6, seed=1, progress=False
    )
    assert (generator.batch_size, generator.max_new_tokens) == (4, 6)
    plain = gen.HFGenerator(model, tokenizer, batch_size=1, max_new_tokens=6, progress=False)
    assert generator.generate(prompts) == plain.generate(prompts)
    assert loaded.chat_template == tokenizer.chat_template  # the model folder's own
    assert "use_vllm is set but vLLM is not installed" in caplog.text


def test_vllm_path_with_a_stand_in_module(tiny, fake_vllm):
    _, tokenizer, path = tiny
    assert gen.vllm_available()
    generator, tok = gen.make_generator(
        path, use_vllm=True, batch_size=4, max_new_tokens=33, seed=5
    )
    assert isinstance(generator, gen.VLLMGenerator)
    (llm,) = _FakeLLM.instances
    assert llm.kwargs["model"] == str(path) and llm.kwargs["seed"] == 5
    prompts = ["<|im_start|>user\nabc<|im_end|>\n<|im_start|>assistant\n", "short"]
    assert generator.generate(prompts) == [f"SELECT {len(p)} -- 0" for p in prompts]
    sent, sp = llm.calls[-1]
    assert sent == prompts
    assert (sp.temperature, sp.max_tokens, sp.n) == (0.0, 33, 1)
    assert tok.convert_tokens_to_ids(IM_END) in sp.stop_token_ids

    groups = generator.sample(prompts, n=3, temperature=0.7, seed=9)
    assert groups == [[f"SELECT {len(p)} -- {k}" for k in range(3)] for p in prompts]
    _, sp = llm.calls[-1]
    assert (sp.temperature, sp.max_tokens, sp.n, sp.seed) == (0.7, 33, 3, 9)
    assert generator.generate([]) == [] and len(llm.calls) == 2


def test_vllm_gets_every_decoding_setting_and_no_checkpoint_defaults(hostile, fake_vllm):
    _, _, path, _ = hostile
    # the stand-in reads the checkpoint as vLLM does when the LLM is built the default way
    leaky = _FakeLLM(model=str(path)).get_default_sampling_params()
    assert (leaky.repetition_penalty, leaky.top_k, leaky.top_p) == (1.3, 5, 0.5)
    _FakeLLM.instances.clear()

    generator, _ = gen.make_generator(path, use_vllm=True, batch_size=4, max_new_tokens=20, seed=3)
    (llm,) = _FakeLLM.instances
    assert llm.kwargs["generation_config"] == "vllm"  # no sampling defaults from the checkpoint
    assert not llm.kwargs["override_generation_config"]
    default = llm.get_default_sampling_params()
    assert (
        default.repetition_penalty,
        default.top_k,
        default.top_p,
        default.min_p,
        default.temperature,
    ) == (1.0, 0, 1.0, 0.0, 1.0)

    generator.generate(["a prompt"])
    _, greedy = llm.calls[-1]
    assert VLLM_DECODING_FIELDS <= set(greedy.kw)
    assert (
        greedy.temperature,
        greedy.top_p,
        greedy.top_k,
        greedy.min_p,
        greedy.repetition_penalty,
        greedy.presence_penalty,
        greedy.frequency_penalty,
        greedy.min_tokens,
        greedy.ignore_eos,
        greedy.watermarking,
    ) == (0.0, 1.0, 0, 0.0, 1.0, 0.0, 0.0, 0, False, False)

    generator.sample(["a prompt"], n=4, temperature=0.9, seed=11)
    _, sampled = llm.calls[-1]
    assert VLLM_DECODING_FIELDS <= set(sampled.kw)
    assert (
        sampled.n,
        sampled.temperature,
        sampled.seed,
        sampled.top_p,
        sampled.top_k,
        sampled.min_p,
        sampled.repetition_penalty,
        sampled.max_tokens,
    ) == (4, 0.9, 11, 1.0, 0, 0.0, 1.0, 20)


@pytest.mark.vllm
def test_the_stand_in_is_the_installed_vllms_sampling_params():
    """The stand-in's fields and defaults (tests/vllm_stand_in.py, which the server's tests use
    too) are those of the vLLM installed (`pytest -m vllm`: the
    CPU build, the same Python source as requirements-gpu.txt's vLLM), so a vLLM upgrade that
    adds, drops or changes a field fails here; and the real SamplingParams takes every setting."""
    vllm = pytest.importorskip("vllm")
    import msgspec

    declared = {
        f.name: f.default
        for f in msgspec.structs.fields(vllm.SamplingParams)
        if not f.name.startswith("_") and f.name != "output_text_buffer_length"  # set by vLLM
    }
    declared["output_kind"] = declared["output_kind"].name
    assert declared == SAMPLING_DEFAULTS
    import dataclasses

    from vllm.sampling_params import StructuredOutputsParams

    from tests.vllm_stand_in import StructuredOutputsParams as StandIn

    def init_fields(cls):  # the constrained requests' type (sqlrl/serve, VLLMGenerator)
        return {f.name: f.default for f in dataclasses.fields(cls) if f.init}

    assert init_fields(StructuredOutputsParams) == init_fields(StandIn)
    greedy = vllm.SamplingParams(**gen.vllm_sampling_settings(1, 0.0, 20, [7]))
    assert (greedy.temperature, greedy.top_k, greedy.stop_token_ids) == (0.0, 0, [7])
    assert greedy.watermarking is False and greedy.trace_decode_token_ids is None
    sampled = vllm.SamplingParams(**gen.vllm_sampling_settings(4, 0.9, 20, [7], seed=11))
    assert (sampled.n, sampled.temperature, sampled.seed, sampled.top_p) == (4, 0.9, 11, 1.0)


def test_vllm_not_used_when_the_profile_says_no(tiny, fake_vllm):
    _, _, path = tiny
    generator, _ = gen.make_generator(
        path, use_vllm=False, batch_size=2, max_new_tokens=4, seed=0, progress=False
    )
    assert isinstance(generator, gen.HFGenerator) and not _FakeLLM.instances


# --------------------------------------------------------------------------- pass-rate filter


def test_pass_rate_filter_samples_through_the_generator_factory(
    tiny, fake_vllm, prepared_dir, tmp_path
):
    """stages/grpo_prompts with grpo.use_vllm and vLLM installed: the SFT model is sampled by
    vLLM (not by transformers on the CPU), with the grpo settings."""
    import yaml

    from sqlrl.jsonio import read_json, read_jsonl
    from stages import grpo_prompts, parse_stage_args
    from tests.repo_tools import SPIDER_DIR, fixed_params_dict

    _, tokenizer, model_path = tiny
    rows = read_jsonl(prepared_dir / "grpo.jsonl")[:6]
    (tmp_path / "data" / "prepared").mkdir(parents=True)
    (tmp_path / "data" / "prepared" / "grpo.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    shutil.copytree(model_path, tmp_path / "models" / "sft")
    params = fixed_params_dict()
    params["seed"] = 7
    params["grpo"].update(
        use_vllm=True,
        temperature=0.7,
        max_completion_length=40,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        repetition_penalty=1.0,
    )
    params["grpo"]["pass_rate_filter"] = {
        "pool": 6,
        "samples": 4,
        "min_rate": 0.01,
        "max_rate": 0.99,
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    # the stand-in solves every prompt with half of its samples
    _FakeLLM.answers = {
        render_prompt(tokenizer, r["prompt"]): [r["gold_sql"], "SELECT 0"] * 2 for r in rows
    }

    argv = ["--model", str(tmp_path / "models" / "sft"), "--spider", str(SPIDER_DIR)]
    argv += ["--prompts", str(tmp_path / "data" / "prepared" / "grpo.jsonl")]
    argv += ["--out", str(tmp_path / "data" / "grpo_prompts.jsonl")]
    argv += ["--metrics", str(tmp_path / "metrics" / "grpo_prompts.json")]
    argv += ["--params", str(tmp_path / "params.yaml")]
    args = parse_stage_args("grpo_prompts", grpo_prompts.arguments, argv=argv)
    assert grpo_prompts.main(args) == 0
    (llm,) = _FakeLLM.instances
    assert llm.kwargs["model"] == str(tmp_path / "models" / "sft")
    assert llm.kwargs["generation_config"] == "vllm"
    ((sent, sp),) = llm.calls
    assert (sp.n, sp.temperature, sp.max_tokens, sp.seed) == (4, 0.7, 40, 7)
    assert (sp.top_k, sp.top_p, sp.repetition_penalty) == (0, 1.0, 1.0)
    metrics = read_json(tmp_path / "metrics" / "grpo_prompts.json")
    # the pool is every prompt whose gold result is not empty: each sampled once, 4 times
    dropped = metrics["dropped_empty_gold"] + metrics["dropped_gold_error"]
    assert metrics["pass_rate_pool"] == len(sent) == len(set(sent)) == len(rows) - dropped
    assert metrics["kept"] == len(sent) and metrics["pool_mean_pass_rate"] == 0.5
    kept = read_jsonl(tmp_path / "data" / "grpo_prompts.jsonl")
    assert {render_prompt(tokenizer, r["prompt"]) for r in kept} == set(sent)


def test_pass_rate_filter_without_vllm_uses_transformers_and_says_so(tiny, monkeypatch, caplog):
    import dataclasses

    from stages import grpo_prompts
    from tests.repo_tools import fixed_params

    _, _, model_path = tiny
    monkeypatch.setitem(sys.modules, "vllm", None)  # not installed
    grpo = fixed_params().grpo
    grpo = dataclasses.replace(
        grpo,
        use_vllm=True,
        batch_size=16,
        num_generations=8,
        max_completion_length=24,
        pass_rate_filter=dataclasses.replace(grpo.pass_rate_filter, samples=8),
    )
    generator, tokenizer = grpo_prompts.pass_rate_generator(model_path, grpo, seed=0)
    assert isinstance(generator, gen.HFGenerator) and tokenizer.chat_template
    # 16 completions a batch, as a GRPO step: 2 prompts x 8 samples, not 16 prompts x 8
    assert (generator.batch_size, generator.max_new_tokens) == (2, 24)
    assert "grpo.use_vllm is set but vLLM is not installed" in caplog.text


def test_decoding_summary_says_greedy_without_penalty():
    from sqlrl.model.generate import HFGenerator, decoding_summary

    generator = HFGenerator.__new__(HFGenerator)  # only its type matters here
    summary = decoding_summary(generator, temperature=0.8, n=1)
    assert summary["backend"] == "HFGenerator"
    assert (summary["do_sample"], summary["repetition_penalty"], summary["num_beams"]) == (
        False,
        1.0,
        1,
    )
    assert decoding_summary(generator, temperature=0.8, n=4)["do_sample"] is True
