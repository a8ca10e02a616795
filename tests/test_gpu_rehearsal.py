"""scripts/gpu_rehearsal.py, both halves, as a user runs them: the bundle from the real Spider
with the reference profile, then `run --tiny` on the CPU through the pipeline's own SFT and
GRPO code. The GPU gets one try; these are the things that would waste it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.repo_tools import REPO_ROOT

# ~4 minutes: TRL's GRPO log-prob head scores all 152k logits at every position without Triton
pytestmark = pytest.mark.slow

SCRIPT = REPO_ROOT / "scripts" / "gpu_rehearsal.py"
SFT_ROWS, GRPO_PROMPTS = 8, 16


def _script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, spider_dir):
    out = tmp_path_factory.mktemp("rehearsal") / "bundle"
    _script(
        "bundle",
        "--out",
        str(out),
        "--sft-rows",
        str(SFT_ROWS),
        "--grpo-prompts",
        str(GRPO_PROMPTS),
    )
    return out


@pytest.fixture(scope="module")
def report(bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("rehearsal-out")
    _script(
        "run",
        "--bundle",
        str(bundle),
        "--out",
        str(out),
        "--work",
        str(tmp_path_factory.mktemp("rehearsal-work")),
        "--tiny",
        "--sft-steps",
        "1",
        "--grpo-steps",
        "1",
    )
    return json.loads((out / "gpu_rehearsal.json").read_text())


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_bundle_holds_the_reference_params_and_its_longest_rows(bundle):
    params = json.loads((bundle / "params.json").read_text())
    assert params["profile"] == "qwen2.5-coder-3b"
    assert params["prepare"]["schema_format"] == "ddl" and params["sft"]["use_lora"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    sft = _jsonl(bundle / "sft.jsonl")
    assert len(sft) == manifest["sft_rows"] == SFT_ROWS
    assert "CREATE TABLE" in sft[0]["prompt"][1]["content"]  # the prepare stage's DDL prompts
    # the longest row kept is the longest prepare measured over all of Spider's training set
    assert manifest["sft_row_tokens"]["max"] == manifest["prepared_sft_tokens"]["max"] > 1500
    assert manifest["bundle_mib"] < 40 and manifest["wheels"] == []


def test_bundle_grpo_prompts_mix_lengths_and_carry_their_databases(bundle):
    rows = _jsonl(bundle / "grpo.jsonl")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert len(rows) == GRPO_PROMPTS
    tokens = manifest["grpo_prompt_tokens"]
    assert tokens["max"] > 1500 and tokens["min"] < 1000  # long and ordinary prompts
    for row in rows:
        assert not os.path.isabs(row["db_path"])  # relative: the bundle travels
        assert (bundle / row["db_path"]).is_file() and row["gold_sql"]
    databases = {p.parent.name for p in (bundle / "database").glob("*/*.sqlite")}
    assert databases == {row["db_id"] for row in rows}  # only the databases needed


def test_tiny_run_trains_every_row_through_the_pipelines_sft(report):
    assert report["status"] == "ok" and report["errors"] == {}
    sft = report["sft"]
    assert sft["rows_trained"] == sft["rows_given"] == SFT_ROWS
    assert sft["steps"] == 1 and sft["overrides"]["max_steps"] == 1
    assert sft["max_row_tokens"] > 1500 and sft["tokens_per_second"] > 0
    assert sft["use_lora"] is True and sft["dtype"] == "bfloat16"


def test_tiny_run_grpo_steps_with_many_questions_and_the_execution_reward(report):
    grpo = report["grpo"]
    assert grpo["steps"] == 1 and grpo["use_vllm"] is False
    assert grpo["prompts_per_step"] >= 8
    assert grpo["completions_per_step"] == grpo["prompts_per_step"] * grpo["generations"]
    assert 0.0 <= grpo["final_mean_reward"] <= 1.0  # scored on the bundle's databases
    split = grpo["seconds_per_step"]
    assert split["generation"] > 0 and split["update"] > 0


def test_tiny_run_reports_what_sizes_the_gpu_run(report):
    assert report["longest_prompt_tokens"] > 1500
    assert report["model"]["n_params"] > 0 and report["model"]["config"] == "tiny"
    for package in ("torch", "transformers", "trl", "peft"):
        assert report["versions"][package]
    assert report["device"]["cuda"] is False  # on a CPU: no GPU memory fields
