"""The paired bootstrap that says whether GRPO beat SFT on the same questions."""

from __future__ import annotations

import pytest

from sqlrl.eval.compare import compare_predictions, paired_bootstrap


def test_a_clear_improvement_excludes_zero():
    baseline = [0] * 100
    candidate = [1] * 30 + [0] * 70
    result = paired_bootstrap(baseline, candidate, seed=1)
    assert result["diff"] == 0.3 and result["n"] == 100
    assert 0 < result["ci95"][0] < 0.3 < result["ci95"][1] and result["excludes_zero"]
    assert (result["wins"], result["losses"]) == (30, 0)


def test_a_wash_includes_zero_and_is_seeded():
    baseline = [1, 0] * 50
    candidate = [0, 1] * 50
    result = paired_bootstrap(baseline, candidate, seed=3)
    assert result["diff"] == 0.0 and not result["excludes_zero"]
    assert result["ci95"][0] < 0 < result["ci95"][1]
    assert paired_bootstrap(baseline, candidate, seed=3) == result


def test_skipped_items_are_left_out():
    result = paired_bootstrap([1, None, 0], [1, 1, None])
    assert result["n"] == 1 and result["diff"] == 0.0
    assert paired_bootstrap([None], [None])["n"] == 0


def test_prediction_files_must_ask_the_same_questions():
    a = [{"question": "q1", "db_id": "d", "ex": 1}]
    b = [{"question": "q2", "db_id": "d", "ex": 1}]
    with pytest.raises(ValueError, match="differ at item 0"):
        compare_predictions(a, b)
    with pytest.raises(ValueError, match="cannot pair"):
        paired_bootstrap([1, 0], [1])


def test_the_comparison_is_repeated_without_trivial_gold_questions():
    from sqlrl.eval.compare import compare_predictions

    rows = lambda exs, trivial: [
        {
            "question": f"q{i}",
            "db_id": "d",
            "ex": e,  # noqa: E731
            **({"gold_trivial": True} if i in trivial else {}),
        }
        for i, e in enumerate(exs)
    ]
    base = rows([0] * 40, trivial=set(range(20)))
    cand = rows([1] * 20 + [0] * 20, trivial=set(range(20)))  # wins only on trivial golds
    result = compare_predictions(base, cand, seed=0)
    assert result["diff"] == 0.5 and result["excludes_zero"]
    assert result["nontrivial"]["n"] == 20 and result["nontrivial"]["diff"] == 0.0
    assert not result["nontrivial"]["excludes_zero"]


def test_the_command_compares_two_runs_prediction_files(tmp_path, capsys):
    """`python -m sqlrl.eval.compare BASE CAND`: what a setting changed, with its interval, as a
    line and as JSON; a lone file or a missing one is a clear error."""
    import json

    from sqlrl.eval.compare import main
    from sqlrl.jsonio import write_jsonl

    rows = lambda exs: [{"question": f"q{i}", "db_id": "d", "ex": e} for i, e in enumerate(exs)]  # noqa: E731
    base, cand = tmp_path / "base.jsonl", tmp_path / "cand.jsonl"
    write_jsonl(base, rows([0] * 100))
    write_jsonl(cand, rows([1] * 30 + [0] * 70))
    out = tmp_path / "report.json"
    assert main([str(base), str(cand), "--out", str(out), "--seed", "1"]) == 0
    assert "EX 0.0% -> 30.0%, +30.0% [" in capsys.readouterr().out
    report = json.loads(out.read_text())[str(cand)]
    assert report["diff"] == 0.3 and report["excludes_zero"] and report["baseline_ex"] == 0.0
    with pytest.raises(SystemExit) as exit_:
        main([str(base)])
    assert exit_.value.code == 2
    assert main([str(base), str(tmp_path / "absent.jsonl")]) == 1
    assert "absent.jsonl" in capsys.readouterr().out
