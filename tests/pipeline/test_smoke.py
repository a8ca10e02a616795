"""End to end: the real DVC pipeline on the `smoke` profile (see the smoke_repo fixture).

Three whole smoke DAGs run here: the shared `smoke_repo` (every test that only reads a run),
a second run from scratch (reproducibility) and a two-process run (data-parallel training);
each of the latter two says why it cannot read the shared one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tests.repo_tools import fixed_params_dict
from tests.repo_tools import run_cli as _run

pytestmark = pytest.mark.slow


def _metrics(repo: Path, name: str) -> dict:
    return json.loads((repo / "metrics" / f"{name}.json").read_text())


def test_exp_run_composes_the_smoke_profile(smoke_repo):
    """`dvc exp run -S profile=smoke` wrote what `python -m sqlrl.params smoke` composes."""
    params = yaml.safe_load((smoke_repo / "params.yaml").read_text())
    assert params["profile"] == "smoke"
    assert params == fixed_params_dict()  # the tests' profile is smoke, from the same conf/


def test_smoke_run_writes_sane_metrics(smoke_repo):
    params = yaml.safe_load((smoke_repo / "params.yaml").read_text())
    prepared = _metrics(smoke_repo, "prepare")
    # the profile's cut: its 48 training and 24 dev examples, one SFT row each (no copies)
    assert prepared["train"]["sft"] == prepared["train"]["grpo"] == 48
    assert prepared["dev"]["examples"] == 24
    sft = _metrics(smoke_repo, "sft")
    assert sft["examples"] == sft["rows_trained"] == 48
    assert sft["steps"] == 48 // params["sft"]["rows_per_step"] == 6  # one epoch
    # it learnt: below the loss of a uniform guess over its vocabulary
    assert sft["final_loss"] < math.log(_metrics(smoke_repo, "base")["vocab_size"])
    prompts = _metrics(smoke_repo, "grpo_prompts")
    assert prompts["candidates"] == prepared["train"]["grpo"]
    dropped = sum(v for k, v in prompts.items() if k.startswith("dropped_"))
    kept = (smoke_repo / "data" / "grpo_prompts.jsonl").read_text().splitlines()
    assert prompts["kept"] == prompts["candidates"] - dropped == len(kept)
    grpo = _metrics(smoke_repo, "grpo")
    assert grpo["train_prompts"] == prompts["kept"] and grpo["steps"] == params["grpo"]["steps"]
    for name in ("base", "sft", "final"):
        report = _metrics(smoke_repo, f"eval_{name}")["dev"]
        assert report["n"] + report["skipped"] == prepared["dev"]["examples"]
        assert report["n_trivial_gold"] <= report["n"] and "repaired" in report  # schema repair on
        rows = [
            json.loads(line)
            for line in (smoke_repo / "data" / "predictions" / f"{name}.jsonl")
            .read_text()
            .splitlines()
        ]
        assert len(rows) == prepared["dev"]["examples"]
        # the metrics are the predictions file's: a reviewer can recount them from it
        scored = [r for r in rows if r["status"] != "skipped"]
        assert (report["n"], report["skipped"]) == (len(scored), len(rows) - len(scored))
        assert report["ex"] == pytest.approx(sum(r["ex"] for r in scored) / len(scored), abs=1e-6)
        assert report["em"] == pytest.approx(sum(r["em"] for r in scored) / len(scored), abs=1e-6)
        assert {"question", "db_id", "gold", "pred", "ex", "em", "hardness", "status"} <= set(
            rows[0]
        )
    assert "ci95" in _metrics(smoke_repo, "eval_final")["vs_sft"]["dev"]
    assert "ci95" in _metrics(smoke_repo, "eval_sft")["vs_base"]["dev"]


def test_the_final_model_loads_and_reproduces_its_committed_predictions(smoke_repo):
    """What a user does next with models/final: load it and generate. Same prompts, batch
    size and greedy decoding as evaluate@final, so the same completions, token for token."""
    from sqlrl.data.prompts import render_prompt
    from sqlrl.model.generate import make_generator

    params = yaml.safe_load((smoke_repo / "params.yaml").read_text())["eval"]
    dev = [
        json.loads(line)
        for line in (smoke_repo / "data" / "prepared" / "dev.jsonl").read_text().splitlines()
    ]
    predicted = [
        json.loads(line)
        for line in (smoke_repo / "data" / "predictions" / "final.jsonl").read_text().splitlines()
    ]
    todo = [i for i, row in enumerate(dev) if row["prompt"] and row.get("db_present", True)]
    generator, tokenizer = make_generator(
        smoke_repo / "models" / "final",
        use_vllm=False,
        batch_size=params["batch_size"],
        max_new_tokens=params["max_new_tokens"],
        seed=0,
        progress=False,
    )
    outputs = generator.generate([render_prompt(tokenizer, dev[i]["prompt"]) for i in todo])
    assert outputs == [predicted[i]["output"] for i in todo]


def test_second_repro_does_nothing_and_params_rerun_only_their_stages(smoke_repo):
    """On the shared run: params.yaml is changed only for `dvc status` and put back."""
    out = _run(["dvc", "repro"], smoke_repo)
    assert "Running stage" not in out
    params_file = smoke_repo / "params.yaml"
    original = params_file.read_text()
    try:
        params = yaml.safe_load(original)
        params["eval"]["batch_size"] += 1
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        changed = json.loads(_run(["dvc", "status", "--json"], smoke_repo))
        assert set(changed) == {
            "evaluate@base",
            "evaluate@sft",
            "evaluate@final",
            "evaluate@final_constrained",
        }
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


TIMING_KEYS = {
    "wall_seconds",
    "tokens_per_second",
    "generation_seconds",
    "examples_per_second",
    "seconds_per_step",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "compile_seconds",  # the grammars of eval.constrained and evaluate@final_constrained
}


def _without_timings(value):
    """Metrics with wall-clock measurements removed: those differ run to run by nature."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    return value


def test_a_second_run_from_scratch_gives_identical_metrics_and_predictions(
    smoke_repo, tmp_path_factory
):
    """A whole DAG of its own: reproducibility takes a second run from scratch (its own
    clone, DVC cache and run-cache, so nothing is restored from the first), compared with
    the shared run output by output."""
    from tests.conftest import make_smoke_repo

    again = make_smoke_repo(tmp_path_factory.mktemp("repo_again"))
    names = sorted(p.name for p in (smoke_repo / "metrics").glob("*.json"))
    assert {"prepare.json", "sft.json", "grpo_prompts.json", "grpo.json", "eval_final.json"} <= set(
        names
    )
    for name in names:
        first = json.loads((smoke_repo / "metrics" / name).read_text())
        second = json.loads((again / "metrics" / name).read_text())
        assert _without_timings(second) == _without_timings(first), name
    for path in sorted((smoke_repo / "data" / "predictions").glob("*.jsonl")):
        assert (again / "data" / "predictions" / path.name).read_text() == path.read_text()


def test_two_processes_train_data_parallel_and_write_each_output_once(tmp_path_factory):
    """`dvc exp run -S launch.num_processes=2`: sft and grpo run as two gloo processes under
    `accelerate launch`; rank 0 alone deletes, writes and renames, the metrics say so, each
    step trains on the recipe's rows and questions, and the final model loads. A whole DAG
    of its own: the shared run is the one-process run, which the other tests read."""
    from transformers import AutoModelForCausalLM

    from tests.conftest import make_smoke_repo

    repo = make_smoke_repo(
        tmp_path_factory.mktemp("two_processes"), overrides=("launch.num_processes=2",)
    )
    sft, grpo = _metrics(repo, "sft"), _metrics(repo, "grpo")
    assert sft["world_size"] == 2 and grpo["world_size"] == 2
    params = yaml.safe_load((repo / "params.yaml").read_text())
    # a step is the recipe's size on two processes too: each takes half, none is doubled
    assert sft["rows_per_step"] == params["sft"]["rows_per_step"]
    assert grpo["prompts_per_step"] == params["grpo"]["prompts_per_step"]
    assert grpo["completions_per_step"] == (
        params["grpo"]["prompts_per_step"] * params["grpo"]["num_generations"]
    )
    assert not (repo / "models" / "grpo_adapter.tmp").exists()
    final = AutoModelForCausalLM.from_pretrained(repo / "models" / "final")
    assert final.num_parameters() == _metrics(repo, "base")["n_params"]  # merged: no adapter
