"""Grouped-query sdpa for generation (sqlrl/model/attention.py): the same numbers as
transformers' sdpa on a left-padded batch, and used only where it applies."""

from __future__ import annotations

import pytest
import torch

from sqlrl.model.attention import GROUPED_SDPA, grouped_query_attention
from sqlrl.model.generate import HFGenerator
from sqlrl.model.modeling import build_scratch_model, to_transformers_tokenizer, train_tokenizer
from sqlrl.params import ArchitectureParams

TEXTS = ["SELECT count(*) FROM singer", "SELECT name FROM stadium WHERE capacity > 100"] * 20


def tiny_model(kv_heads: int, attn: str = "sdpa"):
    arch = ArchitectureParams(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        vocab_size=300,
    )
    tokenizer = to_transformers_tokenizer(train_tokenizer(TEXTS, arch.vocab_size))
    model = build_scratch_model(arch, tokenizer, seed=0)
    with torch.no_grad():  # large weights: well-separated logits, varied greedy tokens
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    model.set_attn_implementation(attn)
    return model.eval(), tokenizer


def left_padded(tokenizer, texts):
    tokenizer.padding_side = "left"
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


@pytest.fixture(scope="module")
def grouped():
    return tiny_model(kv_heads=2)


def test_left_padded_logits_equal_transformers_sdpa(grouped):
    model, tokenizer = grouped
    batch = left_padded(tokenizer, ["SELECT name FROM stadium WHERE capacity", "SELECT"])
    assert (batch["attention_mask"] == 0).any()  # the padding mask is really exercised
    with torch.no_grad():
        expected = model(**batch).logits
        grouped_query_attention(model)
        assert model.config._attn_implementation == GROUPED_SDPA
        got = model(**batch).logits
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(got[mask], expected[mask], rtol=1e-5, atol=1e-5)


def test_greedy_generation_is_token_for_token_the_same():
    reference, tokenizer = tiny_model(kv_heads=2)
    switched, _ = tiny_model(kv_heads=2)
    prompts = ["SELECT name FROM", "SELECT count(*) FROM singer WHERE", "SELECT"]
    batch = left_padded(tokenizer, prompts)
    settings = dict(max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        expected = reference.generate(**batch, **settings)
        got = grouped_query_attention(switched).generate(**batch, **settings)
    assert switched.config._attn_implementation == GROUPED_SDPA
    assert torch.equal(got, expected)


@pytest.mark.parametrize("kv_heads, attn", [(4, "sdpa"), (2, "eager")])
def test_left_alone_where_it_does_not_apply(kv_heads, attn):
    model, _ = tiny_model(kv_heads=kv_heads, attn=attn)
    assert grouped_query_attention(model).config._attn_implementation == attn


def test_the_transformers_generator_uses_it(grouped):
    model, tokenizer = tiny_model(kv_heads=2)
    generator = HFGenerator(model, tokenizer, batch_size=2, max_new_tokens=4, progress=False)
    assert generator.model.config._attn_implementation == GROUPED_SDPA


def test_a_saved_model_does_not_name_it(tmp_path):
    """The merged model is loaded by vLLM and other processes, where it is not registered."""
    model, _ = tiny_model(kv_heads=2)
    grouped_query_attention(model).save_pretrained(tmp_path)
    assert GROUPED_SDPA not in (tmp_path / "config.json").read_text()
