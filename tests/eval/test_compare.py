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
