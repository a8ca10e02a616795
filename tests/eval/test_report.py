"""The pull-request report: tables, flipped questions and PNG plots against a baseline rev."""

from __future__ import annotations

import json
import re

import pytest

from sqlrl.eval.report import build_report, flipped_questions
from tests.repo_tools import run_cli

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def _write(root, name, data):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    elif name.endswith(".tsv"):
        path.write_text("step\tloss\n" + "".join(f"{i}\t{v}\n" for i, v in enumerate(data)))
    else:
        path.write_text(json.dumps(data) if not isinstance(data, str) else data)


def _pred(question, ex, pred):
    return {"question": question, "db_id": "d", "gold": "SELECT 1", "pred": pred, "ex": ex}


@pytest.fixture
def repo(tmp_path):
    """A DVC repo with a baseline commit and a changed workspace."""
    run_cli(["git", "init", "-q"], tmp_path)
    run_cli(["dvc", "init", "-q"], tmp_path)
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  ev:\n    cmd: 'true'\n    params: [eval]\n    metrics:\n"
        "      - metrics/eval_sft.json:\n          cache: false\n"
    )
    _write(tmp_path, "params.yaml", "eval:\n  batch_size: 8\n")
    _write(
        tmp_path,
        "metrics/eval_sft.json",
        {"ex": 0.5, "em": 0.25, "n": 2, "by_hardness": {"easy": {"n": 2, "ex": 0.5, "em": 0.25}}},
    )
    _write(tmp_path, "data/predictions/sft.jsonl", [_pred("q1", 1, "A"), _pred("q2", 0, "B")])
    _write(tmp_path, "dvclive/sft/plots/metrics/loss.tsv", [3.0, 2.0, 1.5])
    run_cli(GIT + ["add", "-A"], tmp_path)
    run_cli(GIT + ["commit", "-qm", "baseline"], tmp_path)
    _write(tmp_path, "params.yaml", "eval:\n  batch_size: 16\n")
    dev = {
        "ex": 1.0,
        "em": 0.5,
        "n": 2,
        "ex_nontrivial": 1.0,
        "n_trivial_gold": 1,
        "by_hardness": {"easy": {"n": 2, "ex": 1.0, "em": 0.5}},
    }
    _write(tmp_path, "metrics/eval_sft.json", {"dev": dev})  # the baseline has the old layout
    _write(tmp_path, "data/predictions/sft.jsonl", [_pred("q1", 1, "A"), _pred("q2", 1, "C")])
    _write(tmp_path, "dvclive/sft/plots/metrics/loss.tsv", [3.0, 1.0, 0.5])
    return tmp_path


def test_report_shows_diffs_flips_and_plots(repo):
    report = build_report("HEAD", repo / "report", root=repo)
    text = report.read_text()
    assert "| sft | dev | 1 | +0.5 | 0.5 | +0.25 | 2 |" in text
    assert "| sft | dev, non-trivial gold | 1 |  | — |  | 1 |" in text  # nothing to compare with
    # DVC's own tables (`dvc params diff --md`, `dvc metrics diff --md`)
    assert re.search(r"\| params.yaml +\| eval.batch_size +\| 8 +\| 16 +\|", text)
    assert re.search(r"\| metrics/eval_sft.json +\| dev.ex +\| - +\| 1.0 +\|", text)
    assert (
        "`sft`: 1 fixed, 0 broken" in text and "| 1 | fixed | q2 | `SELECT 1` | `B` | `C` |" in text
    )
    for png in ("sft_loss.png", "ex_by_hardness.png"):
        assert (repo / "report" / png).read_bytes()[:4] == b"\x89PNG"
        assert f"![{png}]({png})" in text


def test_unknown_baseline_is_a_clear_error(repo):
    with pytest.raises(ValueError, match="not a git revision"):
        build_report("no-such-branch", repo / "report", root=repo)


def test_flips_refuse_files_with_different_questions():
    with pytest.raises(ValueError, match="dev set changed"):
        flipped_questions([_pred("a", 1, "x")], [_pred("b", 1, "x")])


def test_curves_are_drawn_over_optimizer_steps_not_log_numbers():
    """DVCLive numbers an SFT curve logged every 50 steps 0, 1, 2, ...: the plot's x axis is
    the optimizer step, from the epoch at each log and the stage's steps per epoch."""
    from sqlrl.eval.report import optimizer_steps

    files = {
        "dvclive/sft/plots/metrics/epoch.tsv": "step\tepoch\n0\t0.0005\n1\t0.05\n2\t0.1\n3\t0.15\n",
        "metrics/sft.json": json.dumps({"steps": 2000, "epochs": 2.0}),
    }
    steps = optimizer_steps(
        "dvclive/sft/plots/metrics/loss.tsv", [0.0, 1.0, 2.0], "metrics/sft.json", files.get
    )
    assert steps == [0, 50, 100]
    assert (
        optimizer_steps("dvclive/sft/plots/metrics/loss.tsv", [9.0], "metrics/sft.json", files.get)
        is None
    )


def test_a_noisy_reward_is_smoothed_by_a_trailing_mean():
    from sqlrl.eval.report import smoothed

    assert smoothed([0.0, 1.0, 0.0, 1.0, 0.0, 1.0], 2) == [0.0, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert smoothed([0.2, 0.4], 5) == pytest.approx([0.2, 0.3])


def test_the_benchmark_table_has_a_row_per_model_and_a_column_per_set():
    from sqlrl.eval.report import benchmark_table

    split = {"n": 10, "skipped": 0, "ex": 0.5}
    evals = {
        "base": {"dev": {**split, "ex": 0.0}, "generation": {"backend": "HFGenerator"}},
        "sft": {"dev": split, "bird_dev": {"n": 4, "skipped": 6, "ex": 0.25}},
        "final": {
            "dev": split,
            "bird_dev": {"n": 4, "skipped": 6, "ex": 0.5, "maj": {"k": 4, "ex": 0.75}},
            "vs_sft": {"dev": {"diff": 0.0}},
        },
    }
    lines = benchmark_table(evals).splitlines()
    assert lines[0] == "| model | dev | bird_dev |"
    assert lines[2:5] == [
        "| base | 0.0% | — |",
        "| SFT | 50.0% | 25.0% |",
        "| GRPO (final) | 50.0% | 50.0% (maj@4 75.0%) |",
    ]
    assert lines[-1] == "Questions: dev 10 scored, bird_dev 4 scored (6 skipped)."
