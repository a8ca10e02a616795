"""End to end: the real DVC pipeline on the `smoke` profile (see the smoke_repo fixture)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.repo_tools import SMOKE_TARGET as TARGET
from tests.repo_tools import run_cli as _run

pytestmark = pytest.mark.slow


def _metrics(repo: Path, name: str) -> dict:
    return json.loads((repo / "metrics" / f"{name}.json").read_text())


def test_exp_run_composes_the_smoke_profile(smoke_repo):
    params = yaml.safe_load((smoke_repo / "params.yaml").read_text())
    assert params["profile"] == "smoke"
    assert params["prepare"]["max_train_examples"] > 0


def test_smoke_run_writes_sane_metrics(smoke_repo):
    prepared = _metrics(smoke_repo, "prepare")
    assert 0 < prepared["train"]["sft"] <= 48
    sft = _metrics(smoke_repo, "sft")
    assert sft["steps"] > 0 and sft["final_loss"] > 0
    for name in ("base", "sft"):
        report = _metrics(smoke_repo, f"eval_{name}")
        assert report["n"] + report["skipped"] == prepared["dev"]["examples"]
        assert 0.0 <= report["ex"] <= 1.0 and 0.0 <= report["em"] <= 1.0
        rows = [json.loads(line) for line in
                (smoke_repo / "data" / "predictions" / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == prepared["dev"]["examples"]
        assert {"question", "db_id", "gold", "pred", "ex", "em", "hardness", "status"} <= set(rows[0])
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(smoke_repo / "models" / "sft") is not None


def test_second_repro_does_nothing_and_params_rerun_only_their_stages(smoke_repo):
    out = _run(["dvc", "repro", TARGET], smoke_repo)
    assert "Running stage" not in out
    params_file = smoke_repo / "params.yaml"
    original = params_file.read_text()
    try:
        params = yaml.safe_load(original)
        params["eval"]["batch_size"] += 1
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        changed = json.loads(_run(["dvc", "status", "--json", TARGET], smoke_repo))
        assert set(changed) == {"evaluate@sft"}
        params = yaml.safe_load(original)
        params["prepare"]["sample_rows"] = 1
        params["prepare"]["schema_format"] = "ddl"
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        changed = json.loads(_run(["dvc", "status", "--json", "prepare"], smoke_repo))
        assert set(changed) == {"prepare"}
    finally:
        params_file.write_text(original)
