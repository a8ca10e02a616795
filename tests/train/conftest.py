"""Fixtures the GRPO tests share (test_grpo, test_grpo_resume): real train questions and a tiny
SFT model. The agent tests (test_grpo_agent, test_vllm_grpo) ask department_management's
questions instead, with their own `rows`."""

from __future__ import annotations

import pytest

from sqlrl.data.spider import load_examples, load_schemas
from sqlrl.model.modeling import build_scratch_model, to_transformers_tokenizer, train_tokenizer
from tests.repo_tools import grpo_rows, tiny_arch


@pytest.fixture(scope="module")
def rows(spider_dir):
    """GRPO rows (prompt, gold_sql, db_path) for real train questions, as prepare writes them."""
    schemas = load_schemas(spider_dir / "tables.json")
    return grpo_rows(spider_dir, load_examples(spider_dir / "train_spider.json", schemas)[:16])


@pytest.fixture(scope="module")
def tiny_sft(rows, tmp_path_factory):
    """A tiny Qwen2 model + ChatML tokenizer standing in for models/sft."""
    texts = [m["content"] for r in rows for m in r["prompt"]] + [r["gold_sql"] for r in rows]
    arch = tiny_arch()
    tokenizer = to_transformers_tokenizer(train_tokenizer(texts, arch.vocab_size))
    model = build_scratch_model(arch, tokenizer, seed=0)
    path = tmp_path_factory.mktemp("sft")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
