"""End to end: a GRPO seed sweep with DVC's own queue on the smoke run, then the across-seed
report (sqlrl.eval.seeds) of its experiments, checked against their own metrics."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.repo_tools import run_cli

pytestmark = pytest.mark.slow

SWEEP_TIMEOUT_S = 1800


def _experiments(exp_show: list, names: list[str]) -> dict[str, dict]:
    """name -> its `dvc exp show --json` record (rev, params, metrics), wherever it nests."""
    found = {}

    def walk(node):
        if isinstance(node, dict):
            if node.get("name") in names and isinstance(node.get("data"), dict):
                found[node["name"]] = node["data"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(exp_show)
    return found


def _wait_for_the_queue(repo: Path) -> str:
    """`dvc queue start` detaches its worker: wait until no task is queued or running."""
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    while time.monotonic() < deadline:
        status = run_cli(["dvc", "queue", "status"], repo)
        if not any(word in status for word in ("Queued", "Running")):
            return status
        time.sleep(5)
    raise AssertionError(f"the queue did not finish in {SWEEP_TIMEOUT_S} s:\n{status}")


def _at(repo: Path, rev: str, path: str) -> str:
    return run_cli(["git", "show", f"{rev}:{path}"], repo)


def test_a_grpo_seed_sweep_is_queued_run_and_reported_as_its_runs_measured(smoke_repo, tmp_path):
    # a copy of the smoke run (its DVC cache too), committed as the sweep's baseline: the
    # shared smoke_repo keeps the HEAD its other readers expect
    repo = tmp_path / "sweep"
    shutil.copytree(smoke_repo, repo, symlinks=True)
    run_cli(["git", "add", "-A"], repo)
    run_cli(["git", "commit", "-qm", "the smoke run"], repo)
    baseline_lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]

    # the documented sweep (docs/seeds.md): Hydra's sweep syntax, one queued run per seed; DVC
    # composes params.yaml from conf/ afresh, so the profile is named again
    sweep = ["-S", "profile=smoke", "-S", "grpo.seed=range(42,44)"]
    run_cli(["dvc", "exp", "run", "--queue", *sweep], repo)
    run_cli(["dvc", "queue", "start"], repo)
    status = _wait_for_the_queue(repo)
    assert status.count("Success") == 2, status
    names = run_cli(["dvc", "exp", "ls", "--name-only"], repo).split()
    assert len(names) == 2, names
    records = _experiments(json.loads(run_cli(["dvc", "exp", "show", "--json"], repo)), names)
    seeds = {name: records[name]["params"]["params.yaml"]["data"]["grpo"]["seed"] for name in names}
    assert sorted(seeds.values()) == [42, 43]

    out = repo / "report"
    run_cli([sys.executable, "-m", "sqlrl.eval.seeds", *names, "--out", str(out)], repo)
    report = json.loads((out / "seeds.json").read_text())

    adapters = set()
    for name in names:
        rev = records[name]["rev"]
        lock = yaml.safe_load(_at(repo, rev, "dvc.lock"))["stages"]
        # only grpo onward ran: the one SFT model and prompt selection are the baseline's
        for stage in ("prepare", "base", "sft", "grpo_prompts", "evaluate@sft"):
            assert lock[stage] == baseline_lock[stage], f"{name} reran {stage}"
        adapters.add(
            next(o["md5"] for o in lock["grpo"]["outs"] if o["path"] == "models/grpo_adapter")
        )
        # the seeds the run recorded are the ones it was asked for, and the report's
        grpo_metrics = json.loads(_at(repo, rev, "metrics/grpo.json"))
        assert grpo_metrics["seeds"] == {"pipeline": 42, "grpo": seeds[name]}
        assert report["runs"][name] == {"rev": rev, "seeds": grpo_metrics["seeds"]}
        # each run's numbers are its own metrics': EX per set, maj@2 (the final model is voted
        # on in the smoke profile), and dev and held-out's interval against SFT
        headline = records[name]["metrics"]["metrics/headline_final.json"]["data"]
        evals = json.loads(_at(repo, rev, "metrics/eval_final.json"))
        sets = report["sets"]
        assert set(sets) == {k for k in headline if k != "gain"}
        for split, decodings in sets.items():
            own = decodings["greedy"]["runs"][name]
            assert own["ex"] == pytest.approx(headline[split]["ex"], abs=5e-5)
            assert decodings["maj@2"]["runs"][name]["ex"] == pytest.approx(
                headline[split]["maj"], abs=5e-5
            )
            if split in evals["vs_sft"]:
                vs_sft = evals["vs_sft"][split]
                assert own["diff"] == vs_sft["diff"] == headline["gain"].get(split, own["diff"])
                assert (own["ci95"], own["wins"], own["losses"]) == (
                    vs_sft["ci95"],
                    vs_sft["wins"],
                    vs_sft["losses"],
                )
    assert len(adapters) == 2  # the seed reached GRPO: two different adapters
    for decodings in report["sets"].values():
        runs = decodings["greedy"]["runs"]
        across = decodings["greedy"]["across_seeds"]
        # one SFT model, so its EX is each run's SFT EX; the averaged EX is the runs' mean
        assert across["sft_shared"] and {r["sft_ex"] for r in runs.values()} == {across["sft_ex"]}
        mean = sum(r["ex"] for r in runs.values()) / len(runs)
        assert across["ex"] == pytest.approx(mean, abs=1e-4)
        gains = [r["diff"] for r in runs.values()]
        assert across["range"] == [min(gains), max(gains)]
    table = (out / "seeds.md").read_text()
    assert all(f"| {name} (grpo.seed {seeds[name]}) |" in table for name in names)
    assert "| dev | greedy |" in table and "| dev | maj@2 |" in table
    assert (out / "seeds.png").stat().st_size > 0
