"""End to end: the real DVC pipeline on the `smoke` profile (see the smoke_repo fixture)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

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
    prompts = _metrics(smoke_repo, "grpo_prompts")
    assert prompts["candidates"] == prepared["train"]["grpo"]
    assert 0 < prompts["kept"] == _metrics(smoke_repo, "grpo")["train_prompts"]
    for name in ("base", "sft", "final"):
        report = _metrics(smoke_repo, f"eval_{name}")
        assert report["n"] + report["skipped"] == prepared["dev"]["examples"]
        assert 0.0 <= report["ex"] <= 1.0 and 0.0 <= report["em"] <= 1.0
        assert report["n_trivial_gold"] <= report["n"] and "repaired" in report  # schema repair on
        rows = [json.loads(line) for line in
                (smoke_repo / "data" / "predictions" / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == prepared["dev"]["examples"]
        assert {"question", "db_id", "gold", "pred", "ex", "em", "hardness", "status"} <= set(rows[0])
    assert "ci95" in _metrics(smoke_repo, "eval_final")["vs_sft"]["dev"]
    assert "ci95" in _metrics(smoke_repo, "eval_sft")["vs_base"]["dev"]
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(smoke_repo / "models" / "sft") is not None


def test_second_repro_does_nothing_and_params_rerun_only_their_stages(smoke_repo):
    out = _run(["dvc", "repro"], smoke_repo)
    assert "Running stage" not in out
    params_file = smoke_repo / "params.yaml"
    original = params_file.read_text()
    try:
        params = yaml.safe_load(original)
        params["eval"]["batch_size"] += 1
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        changed = json.loads(_run(["dvc", "status", "--json"], smoke_repo))
        assert set(changed) == {"evaluate@base", "evaluate@sft", "evaluate@final"}
        # a GRPO variant reuses the selected prompts (the pass-rate filter samples the SFT model)
        params = yaml.safe_load(original)
        params["grpo"]["steps"] += 1
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        assert set(json.loads(_run(["dvc", "status", "--json"], smoke_repo))) == {"grpo"}
        params = yaml.safe_load(original)
        params["grpo"]["pass_rate_filter"]["min_rate"] = 0.5
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        changed = json.loads(_run(["dvc", "status", "--json"], smoke_repo))
        assert set(changed) == {"grpo_prompts", "grpo"}
        params = yaml.safe_load(original)
        params["prepare"]["sample_rows"] = 1
        params["prepare"]["schema_format"] = "ddl"
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        changed = json.loads(_run(["dvc", "status", "--json", "prepare"], smoke_repo))
        assert set(changed) == {"prepare"}
    finally:
        params_file.write_text(original)


TIMING_KEYS = {"wall_seconds", "tokens_per_second", "generation_seconds", "examples_per_second",
               "seconds_per_step", "train_runtime", "train_samples_per_second",
               "train_steps_per_second"}


def _without_timings(value):
    """Metrics with wall-clock measurements removed: those differ run to run by nature."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    return value


def test_a_second_run_from_scratch_gives_identical_metrics_and_predictions(smoke_repo,
                                                                          tmp_path_factory):
    from tests.conftest import make_smoke_repo

    again = make_smoke_repo(tmp_path_factory.mktemp("repo_again"))
    names = sorted(p.name for p in (smoke_repo / "metrics").glob("*.json"))
    assert {"prepare.json", "sft.json", "grpo_prompts.json", "grpo.json",
            "eval_final.json"} <= set(names)
    for name in names:
        first = json.loads((smoke_repo / "metrics" / name).read_text())
        second = json.loads((again / "metrics" / name).read_text())
        assert _without_timings(second) == _without_timings(first), name
    for path in sorted((smoke_repo / "data" / "predictions").glob("*.jsonl")):
        assert (again / "data" / "predictions" / path.name).read_text() == path.read_text()
