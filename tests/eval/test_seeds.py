"""The across-seed report (sqlrl.eval.seeds) on hand-made prediction files: each run's gain
over its own SFT model, the gain of the per-question average over the runs, greedy and maj@k
apart, and the runs it refuses to report together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sqlrl.eval.compare import paired_bootstrap
from sqlrl.eval.seeds import Run, SeedReportError, load_run, main, seed_report
from tests.repo_tools import REPO_ROOT, committed_text, is_git_checkout, run_cli

QUESTIONS = [("q0", "db"), ("q1", "db"), ("q2", "db"), ("q3", "absent_db")]


def _rows(verdicts, maj=None) -> list[dict]:
    """Prediction rows as the evaluate stage writes them; None: not scored (skipped)."""
    rows = []
    for i, ((question, db), ex) in enumerate(zip(QUESTIONS, verdicts, strict=True)):
        row = {"question": question, "db_id": db, "ex": ex, "status": "ok"}
        if maj is not None:
            row["maj_ex"] = maj[i]
        rows.append(row)
    return rows


SFT = [1, 0, 0, None]
SEED_A = [1, 1, 0, None]  # won q1: +1/3
SEED_B = [0, 1, 0, None]  # won q1, lost q0: 0


def _run(name, final, sft=SFT, seed=42, rev=None, **maj) -> Run:
    run = Run(name, rev or name, {"pipeline": 42, "grpo": seed}, bootstrap_seed=42)
    run.sets["dev"] = (_rows(sft, maj.get("sft_maj")), _rows(final, maj.get("final_maj")))
    if maj:
        run.maj_k["dev"] = 4
    return run


def test_each_run_and_the_average_over_runs_are_paired_against_sft():
    report = seed_report([_run("a", SEED_A), _run("b", SEED_B, seed=43)])
    greedy = report["sets"]["dev"]["greedy"]
    a, b = greedy["runs"]["a"], greedy["runs"]["b"]
    assert (a["sft_ex"], a["ex"], a["diff"], a["n"]) == (0.3333, 0.6667, 0.3333, 3)
    assert (b["ex"], b["diff"], b["wins"], b["losses"]) == (0.3333, 0.0, 1, 1)
    across = greedy["across_seeds"]
    # per question over the runs: q0 0.5, q1 1, q2 0 against SFT's 1, 0, 0 (q3 unscored)
    assert (across["ex"], across["sft_ex"], across["diff"], across["n"]) == (0.5, 0.3333, 0.1667, 3)
    assert (across["wins"], across["losses"]) == (1, 1)
    assert across["range"] == [0.0, 0.3333] and across["sft_shared"] and across["runs"] == 2
    assert across["ci95"] == paired_bootstrap(SFT, [0.5, 1.0, 0.0, None], seed=42)["ci95"]
    assert report["runs"]["b"]["seeds"] == {"pipeline": 42, "grpo": 43}


def test_averaging_identical_runs_changes_nothing_but_the_count():
    one = seed_report([_run("a", SEED_A)])["sets"]["dev"]["greedy"]["across_seeds"]
    two = seed_report([_run("a", SEED_A), _run("b", SEED_A)])["sets"]["dev"]["greedy"]
    assert {**two["across_seeds"], "runs": 1} == one


def test_each_run_has_its_own_sft_model_when_sft_differs():
    across = seed_report([_run("a", SEED_A), _run("b", SEED_A, sft=[0, 0, 0, None])])
    across = across["sets"]["dev"]["greedy"]["across_seeds"]
    assert not across["sft_shared"] and across["sft_ex"] == 0.1667  # q0: (1 + 0) / 2


def test_maj_at_k_is_reported_apart_and_labelled():
    voted = dict(sft_maj=[0, 0, 0, None], final_maj=[1, 1, 1, None])
    decodings = seed_report([_run("a", SEED_A, **voted)])["sets"]["dev"]
    assert list(decodings) == ["greedy", "maj@4"]
    assert decodings["greedy"]["runs"]["a"]["diff"] == 0.3333
    assert decodings["maj@4"]["runs"]["a"]["diff"] == 1.0


def test_maj_at_k_without_a_voted_sft_model_is_ex_only():
    final_only = dict(sft_maj=[None] * 4, final_maj=[1, 1, 0, None])
    maj = seed_report([_run("a", SEED_A, **final_only)])["sets"]["dev"]["maj@4"]
    assert maj["runs"]["a"] == {"ex": 0.6667} and "diff" not in maj["across_seeds"]


def test_runs_that_asked_other_questions_are_refused():
    other = _run("b", SEED_B)
    other.sets["dev"][1][0]["question"] = "another question"
    with pytest.raises(SeedReportError, match="b's final predictions on dev"):
        seed_report([_run("a", SEED_A), other])


def test_one_commit_given_twice_is_refused():
    with pytest.raises(SeedReportError, match="same commit"):
        seed_report([_run("a", SEED_A, rev="abc"), _run("b", SEED_B, rev="abc")])


def _commit_run(repo: Path, grpo_seed: int, final: list, recorded: int | None = None) -> None:
    """A finished run's files as the pipeline commits them, tagged seed<grpo_seed>."""
    params = {"seed": 42, "grpo": {"seed": grpo_seed}, "eval": {"sets": {"syn": {}}}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    metrics = repo / "metrics"
    metrics.mkdir(exist_ok=True)
    seeds = {"pipeline": 42, "grpo": grpo_seed if recorded is None else recorded}
    (metrics / "grpo.json").write_text(json.dumps({"seeds": seeds}))
    (metrics / "eval_final.json").write_text(json.dumps({"dev": {"ex": 0.5}}))
    predictions = repo / "data" / "predictions"
    for model, verdicts in (("sft", SFT), ("final", final)):
        (predictions / f"{model}_sets").mkdir(parents=True, exist_ok=True)
        for path in (f"{model}.jsonl", f"{model}_sets/syn.jsonl"):
            lines = [json.dumps(row) for row in _rows(verdicts)]
            (predictions / path).write_text("\n".join(lines) + "\n")
        (predictions / f"{model}_heldout.jsonl").write_text("")  # no held-out split
    run_cli(["git", "add", "-A"], repo)
    run_cli(["git", "commit", "-qm", f"seed {grpo_seed}"], repo)
    run_cli(["git", "tag", f"seed{grpo_seed}"], repo)


@pytest.fixture
def two_runs(tmp_path) -> Path:
    run_cli(["git", "init", "-q"], tmp_path)
    run_cli(["git", "config", "user.name", "t"], tmp_path)
    run_cli(["git", "config", "user.email", "t@t.invalid"], tmp_path)
    _commit_run(tmp_path, 42, SEED_A)
    _commit_run(tmp_path, 43, SEED_B)
    return tmp_path


def test_the_command_reads_revisions_and_writes_json_table_and_plot(two_runs, capsys):
    out = two_runs / "report"
    assert main(["seed42", "seed43", "--root", str(two_runs), "--out", str(out)]) == 0
    report = json.loads((out / "seeds.json").read_text())
    assert list(report["sets"]) == ["dev", "syn"]  # the empty held-out split is left out
    assert report["sets"]["syn"]["greedy"]["across_seeds"]["diff"] == 0.1667
    assert report["runs"]["seed43"]["seeds"]["grpo"] == 43
    table = (out / "seeds.md").read_text()
    assert "| seed43 (grpo.seed 43) |" in table
    assert "| dev | greedy | 66.7% (SFT 33.3%): +33.3 [" in table and "+0.0 to +33.3" in table
    assert (out / "seeds.png").stat().st_size > 0 and table in capsys.readouterr().out


def test_a_run_whose_metrics_disagree_with_its_params_is_refused(two_runs, capsys):
    _commit_run(two_runs, 44, SEED_B, recorded=42)
    assert main(["seed42", "seed44", "--root", str(two_runs), "--out", str(two_runs)]) == 1
    said = capsys.readouterr().out
    assert "seed44" in said and "records seeds {'pipeline': 42, 'grpo': 42}" in said
    assert "the run is stale" in said


def test_a_name_that_is_no_run_is_named(two_runs, capsys):
    assert main(["seed42", "no-such-exp", "--root", str(two_runs), "--out", str(two_runs)]) == 1
    assert "'no-such-exp' is neither a DVC experiment nor a git revision" in capsys.readouterr().out


def test_the_committed_runs_gains_are_its_own_vs_sft():
    """On the committed default's predictions (real, non-zero EX): the report's run is the
    evaluate stage's own comparison, interval and counts included."""
    if not is_git_checkout():
        pytest.skip("reads the committed revision: needs a git checkout")
    report = seed_report([load_run("HEAD", REPO_ROOT)])
    vs_sft = json.loads(committed_text("metrics/eval_final.json"))["vs_sft"]
    for split, own in vs_sft.items():
        run = report["sets"][split]["greedy"]["runs"]["HEAD"]
        own = {k: v for k, v in own.items() if k != "nontrivial"}  # the report's is all questions
        assert own["n"] > 100 and {k: run[k] for k in own} == own
