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


def _scratch_base(tokenizer: str, vocab_size: int):
    """base params for a scratch model of ARCH's shape with this tokenizer."""
    return dataclasses.replace(
        fixed_params().base,
        source="scratch",
        dtype="float32",
        tokenizer=tokenizer,
        architecture=dataclasses.replace(ARCH, vocab_size=vocab_size),
    )


def test_scratch_base_saves_model_and_tokenizer(tmp_path):
    base = _scratch_base("trained", vocab_size=300)
    record = build_base(base, 7, _write_sft(tmp_path / "sft.jsonl"), tmp_path / "base")
    model, tok = load_model_and_tokenizer(tmp_path / "base")
    assert record["source"] == "scratch"
    assert record["n_params"] == sum(p.numel() for p in model.parameters())
    assert model.config.vocab_size == len(tok) == record["vocab_size"]
    # the saved tokenizer renders the ChatML prompt the model is trained and served on
    prompt = render_prompt(tok, build_messages("singer | id", "How many?", "SQL only."))
    assert prompt.startswith(f"{IM_START}system\nSQL only.{IM_END}\n{IM_START}user\n")
    assert prompt.endswith(f"{IM_END}\n{IM_START}assistant\n")


def _write_agent_sft(path, n=30):
    """Trajectory rows as prepare writes them in the agent format: the tool's schema, a call,
    the tool's answer, then the SQL."""
    from sqlrl.formats.agent import tool_call_message
    from sqlrl.formats.sql_environment import tool_schemas

    rows = []
    for i in range(n):
        call = tool_call_message(f"SELECT * FROM singer WHERE id = {i} LIMIT 3")
        observation = {"role": "tool", "name": "execute_sql", "content": f"(1 rows)\nid\n{i}"}
        answer = {"role": "assistant", "content": f"SELECT name FROM singer WHERE id = {i}"}
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": f"singer | id, name\n\nQuestion: q{i}"},
                ],
                "completion": [call, observation, answer],
                "tools": tool_schemas(),
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_trained_tools_tokenizer_calls_tools_as_qwen25_does(tmp_path):
    """`base.tokenizer: trained-tools`: a small trained vocabulary that renders, and gets
    parsed back, exactly as Qwen2.5's real tokenizer: the same chat template text (TRL finds
    its response parser and its SFT training template by that text), <tool_call> and
    </tool_call> as whole tokens, kept by decode(skip_special_tokens=True)."""
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        qwen2_5_chat_template,
    )

    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    rows = _write_agent_sft(tmp_path / "sft.jsonl")
    record = build_base(
        _scratch_base("trained-tools", vocab_size=400), 7, tmp_path / "sft.jsonl", tmp_path / "base"
    )
    model, tok = load_model_and_tokenizer(tmp_path / "base")
    assert model.config.vocab_size == len(tok) == record["vocab_size"] <= 400
    assert tok.chat_template == qwen2_5_chat_template
    assert get_training_chat_template(tok) is not None  # SFT's assistant-only loss
    assert tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]) == [3, 4]
    row = rows[0]
    messages = row["prompt"] + row["completion"]
    text = tok.apply_chat_template(messages, tools=row["tools"], tokenize=False)
    qwen = build_qwen25_tokenizer().apply_chat_template(
        messages, tools=row["tools"], tokenize=False
    )
    assert text == qwen
    call = '<tool_call>\n{"name": "execute_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>'
    ids = tok(call + IM_END, add_special_tokens=False)["input_ids"]
    assert ids[0] == 3 and "<tool_call>" in tok.decode(ids, skip_special_tokens=True)
    parsed = add_response_schema(tok).parse_response(ids, prefix="")
    assert parsed["tool_calls"][0]["function"] == {
        "name": "execute_sql",
        "arguments": {"query": "SELECT 1"},
    }


def test_the_default_trained_tokenizer_has_no_tool_tokens(tokenizers_pair):
    """The default's tokenizer (and so its model and every committed output) is unchanged."""
    _, hf = tokenizers_pair
    assert "<tool_call>" not in hf.get_vocab() and "tools" not in hf.chat_template
    with pytest.raises(ValueError, match="tool_tokens"):
        to_transformers_tokenizer(tokenizers_pair[0], tool_template=True)


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
