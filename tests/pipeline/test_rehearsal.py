"""The reference GPU profile rehearsed end to end on a CPU (`dvc exp run -S
profile=qwen-rehearsal`): what a GPU user of qwen2.5-coder-3b would care about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow


def _metrics(repo: Path, name: str) -> dict:
    return json.loads((repo / "metrics" / f"{name}.json").read_text())


def _params(repo: Path) -> dict:
    return yaml.safe_load((repo / "params.yaml").read_text())


def test_no_sft_row_is_cut_or_dropped(rehearsal_repo):
    prepared, sft = _metrics(rehearsal_repo, "prepare"), _metrics(rehearsal_repo, "sft")
    cut = _params(rehearsal_repo)["prepare"]["max_train_examples"]  # the profile's 48
    assert sft["examples"] == sft["rows_trained"] == prepared["train"]["sft"] == cut
    assert sft["max_row_tokens"] < 2560  # the reference sft.max_length
    assert abs(prepared["sft_tokens"]["max"] - sft["max_row_tokens"]) <= 2  # prepare measured it
    assert prepared["schema_format"] == "ddl"


def test_final_model_is_a_plain_bf16_qwen_model(rehearsal_repo):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = rehearsal_repo / "models" / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.dtype == torch.bfloat16 and not (final / "adapter_config.json").exists()
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 151645
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 151644
    assert (final / "sqlrl_prompt.json").is_file()  # the server reads its prompt settings here
    settings = json.loads((final / "sqlrl_prompt.json").read_text())
    assert settings["schema_format"] == "ddl" and settings["sample_rows"] == 3


def test_grpo_trains_on_many_questions_per_step(rehearsal_repo):
    grpo = _metrics(rehearsal_repo, "grpo")
    recipe = _params(rehearsal_repo)["grpo"]["prompts_per_step"]
    assert grpo["prompts_per_step"] == recipe >= 8 and grpo["world_size"] == 1
    assert grpo["steps"] == 2 and grpo["use_vllm"] is False  # no vLLM on a CPU: transformers


def test_evaluation_decodes_greedily(rehearsal_repo):
    report = _metrics(rehearsal_repo, "eval_final")
    generation = report["generation"]
    assert generation["do_sample"] is False and generation["repetition_penalty"] == 1.0
    dev = report["dev"]
    assert dev["n"] + dev["skipped"] == _metrics(rehearsal_repo, "prepare")["dev"]["examples"]
