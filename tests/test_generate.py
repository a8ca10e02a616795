"""Batched generation backends (sqlrl/generate.py) on a tiny Qwen2 model built in the test."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from sqlrl import generate as gen
from sqlrl.modeling import (IM_END, build_scratch_model, to_transformers_tokenizer,
                            train_tokenizer)
from sqlrl.params import ArchitectureParams, EvalParams
from sqlrl.prompts import build_messages, render_prompt

TEXTS = ["SELECT count(*) FROM singer", "SELECT name FROM stadium WHERE capacity > 100",
         "How many singers do we have?", "List the names of all concerts in 2014.",
         "table | col, col | table | col"] * 20
QUESTIONS = ["How many singers?", "List every stadium name ordered by capacity descending.",
             "Name?", "What are the names and countries of singers older than 40 who sang in "
             "a concert in 2014 or 2015?", "Count concerts."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Qwen2 model (hidden 32, 2 layers) + ChatML tokenizer, saved and reloaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    arch = ArchitectureParams(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=512, vocab_size=400)
    tokenizer = to_transformers_tokenizer(train_tokenizer(TEXTS, arch.vocab_size))
    model = build_scratch_model(arch, tokenizer, seed=0)
    with torch.no_grad():  # larger weights than the init default: varied, well-separated logits
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), path


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tokenizer, _ = tiny
    return [render_prompt(tokenizer, build_messages("singer | name, age", q, "Answer in SQL."))
            for q in QUESTIONS]


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


# --------------------------------------------------------------------------- vLLM stand-in

class _FakeLLM:
    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []
        _FakeLLM.instances.append(self)

    def generate(self, prompts, sampling_params):
        self.calls.append((list(prompts), sampling_params))
        n = sampling_params.n
        return [types.SimpleNamespace(prompt=p, outputs=[
            types.SimpleNamespace(text=f"SELECT {len(p)} -- {k}") for k in range(n)])
            for p in prompts]


class _FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = _FakeLLM, _FakeSamplingParams
    _FakeLLM.instances.clear()
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_vllm_absent_falls_back_to_transformers(tiny, monkeypatch):
    _, _, path = tiny
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    assert not gen.vllm_available()
    params = EvalParams(batch_size=4, max_new_tokens=6, use_vllm=True, num_samples=1,
                        temperature=0.8, schema_repair=False)
    generator, tokenizer = gen.make_generator(path, params, seed=1, progress=False)
    assert isinstance(generator, gen.HFGenerator) and isinstance(generator, gen.Generator)
    assert (generator.batch_size, generator.max_new_tokens) == (4, 6)
    assert tokenizer.chat_template


def test_vllm_path_with_a_stand_in_module(tiny, fake_vllm):
    _, tokenizer, path = tiny
    assert gen.vllm_available()
    params = EvalParams(batch_size=4, max_new_tokens=33, use_vllm=True, num_samples=1,
                        temperature=0.8, schema_repair=False)
    generator, tok = gen.make_generator(path, params, seed=5)
    assert isinstance(generator, gen.VLLMGenerator) and isinstance(generator, gen.Generator)
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


def test_vllm_not_used_when_the_profile_says_no(tiny, fake_vllm):
    _, _, path = tiny
    params = EvalParams(batch_size=2, max_new_tokens=4, use_vllm=False, num_samples=1,
                        temperature=0.8, schema_repair=False)
    generator, _ = gen.make_generator(path, params, seed=0, progress=False)
    assert isinstance(generator, gen.HFGenerator) and not _FakeLLM.instances
