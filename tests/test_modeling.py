"""The base model: the scratch tokenizer and model, and the hub path (a local folder)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from sqlrl.data.prompts import build_messages, render_prompt
from sqlrl.model.modeling import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    BaseModelError,
    build_base,
    build_scratch_model,
    load_model_and_tokenizer,
    qwen2_config,
    read_base_record,
    resolve_hub_model,
    to_transformers_tokenizer,
    train_tokenizer,
)
from sqlrl.params import ArchitectureParams
from tests.repo_tools import fixed_params

ARCH = ArchitectureParams(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    vocab_size=600,
)


@pytest.fixture(scope="module")
def spider_texts(spider_dir):
    items = json.loads((spider_dir / "train_spider.json").read_text())[:400]
    tables = json.loads((spider_dir / "tables.json").read_text())[:20]
    texts = [e["question"] for e in items] + [e["query"] for e in items]
    texts += [" | ".join(t["table_names_original"]) for t in tables]
    return texts


@pytest.fixture(scope="module")
def tokenizers_pair(spider_texts):
    raw = train_tokenizer(spider_texts, ARCH.vocab_size)
    return raw, to_transformers_tokenizer(raw)


def test_tokenizer_ids_are_the_same_whichever_loader(tokenizers_pair, spider_texts, tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    raw, hf = tokenizers_pair
    hf.save_pretrained(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)
    reread = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert [auto.convert_tokens_to_ids(t) for t in (ENDOFTEXT, IM_START, IM_END)] == [0, 1, 2]
    messages = [
        {"role": "system", "content": "SQL only."},
        {"role": "user", "content": spider_texts[0]},
        {"role": "assistant", "content": spider_texts[400]},
    ]
    chat = auto.apply_chat_template(messages, tokenize=False)
    assert chat.startswith(f"{IM_START}system\nSQL only.{IM_END}\n{IM_START}user\n")
    samples = spider_texts[:50] + spider_texts[400:450] + [chat, "Ünïcödé  café\n\ttabs 12345"]
    for text in samples:
        ids = auto(text, add_special_tokens=False)["input_ids"]
        assert ids == raw.encode(text).ids == reread.encode(text).ids, text
        assert auto.decode(ids) == raw.decode(ids, skip_special_tokens=False)
    assert auto.decode(auto(chat, add_special_tokens=False)["input_ids"]) == chat
    assert auto.eos_token == IM_END and auto.pad_token == ENDOFTEXT


def test_generation_prompt_ends_with_the_assistant_header(tokenizers_pair):
    _, hf = tokenizers_pair
    text = hf.apply_chat_template(
        [{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith(f"{IM_START}assistant\n")
    assert text.startswith(f"{IM_START}system\n")  # Qwen's default system turn


def test_model_is_built_from_params_seeded_and_reloads(tokenizers_pair, tmp_path):
    from transformers import AutoModelForCausalLM

    _, hf = tokenizers_pair
    a = build_scratch_model(ARCH, hf, seed=1)
    b = build_scratch_model(ARCH, hf, seed=1)
    c = build_scratch_model(ARCH, hf, seed=2)
    cfg = a.config
    assert cfg.model_type == "qwen2"
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.vocab_size,
    ) == (32, 2, 4, 2, len(hf))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    a.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    x = torch.tensor([[1, 5, 7, 9]])
    assert torch.allclose(a(x).logits, reloaded(x).logits)


def test_bad_architecture_is_refused(tokenizers_pair):
    with pytest.raises(ValueError, match="num_attention_heads"):
        qwen2_config(dataclasses.replace(ARCH, num_key_value_heads=3), tokenizers_pair[1])


def _write_sft(path, n=30):
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "s"},
                {
                    "role": "user",
                    "content": f"Database schema:\nsinger | id, name\n\nQuestion: q{i}",
                },
            ],
            "completion": [
                {"role": "assistant", "content": f"SELECT name FROM singer WHERE id = {i}"}
            ],
            "db_id": "x",
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_scratch_base_saves_model_and_tokenizer(tmp_path):
    base = dataclasses.replace(
        fixed_params().base,
        source="scratch",
        dtype="float32",
        tokenizer="trained",
        architecture=dataclasses.replace(ARCH, vocab_size=300),
    )
    record = build_base(base, 7, _write_sft(tmp_path / "sft.jsonl"), tmp_path / "base")
    model, tok = load_model_and_tokenizer(tmp_path / "base")
    assert record["source"] == "scratch"
    assert record["n_params"] == sum(p.numel() for p in model.parameters())
    assert model.config.vocab_size == len(tok) == record["vocab_size"]
    # the saved tokenizer renders the ChatML prompt the model is trained and served on
    prompt = render_prompt(tok, build_messages("singer | id", "How many?", "SQL only."))
    assert prompt.startswith(f"{IM_START}system\nSQL only.{IM_END}\n{IM_START}user\n")
    assert prompt.endswith(f"{IM_END}\n{IM_START}assistant\n")


def test_hub_path_with_a_local_folder_standing_in_for_a_hub_id(tokenizers_pair, tmp_path):
    _, hf = tokenizers_pair
    hub = tmp_path / "hub-model"
    build_scratch_model(ARCH, hf, seed=1).save_pretrained(hub)
    hf.save_pretrained(hub)
    base = dataclasses.replace(
        fixed_params().base,
        source="hub",
        model_id=str(hub),
        revision="0123456789abcdef0123456789abcdef01234567",
        dtype="float32",
    )
    record = build_base(base, 0, tmp_path / "unused.jsonl", tmp_path / "base")
    assert record["source"] == "hub" and record["dtype"] == "float32"
    assert read_base_record(tmp_path / "base") == record
    assert not (tmp_path / "base" / "model.safetensors").exists()  # no second copy
    model, tok = load_model_and_tokenizer(tmp_path / "base")
    assert model.config.hidden_size == ARCH.hidden_size and len(tok) == len(hf)
    assert record["n_params"] == sum(p.numel() for p in model.parameters())


def test_offline_hub_failure_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(BaseModelError, match=r"HF_HUB_OFFLINE=1.*hf download no-such-org/no-model"):
        resolve_hub_model("no-such-org/no-model", "0123456789abcdef0123456789abcdef01234567")
    with pytest.raises(BaseModelError, match="pin a commit"):
        resolve_hub_model("no-such-org/no-model", "")
