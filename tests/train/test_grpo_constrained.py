"""grpo.constrained (issue 46): GRPO rollouts on TRL's transformers path sampled under each
prompt's own database grammar, with a batch that mixes a database that has one and a database
without a schema (its rollouts sample unconstrained, counted), on the tiny random SFT model the
other GRPO tests train: unconstrained, its completions are noise the grammar refuses."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from sqlrl.data.spider import Column, Schema, Table, load_schemas
from sqlrl.params import ParamsError, compose_params, params_from_dict
from sqlrl.sql.grammar import checked_grammar_text, matcher_for
from sqlrl.train.constrained import RolloutGrammars
from sqlrl.train.grpo import train_grpo
from tests.repo_tools import SPIDER_DIR, fixed_params

pytest.importorskip("xgrammar")

ABSENT = "not_in_tables"  # a db_id tables.json lacks: its rows fall back


def _grpo_params(**changes):
    base = params_from_dict(compose_params("smoke")).grpo
    return dataclasses.replace(base, **changes)


def _run(rows, tiny_sft, tmp_path, constrained: bool):
    """(metrics, [(db_id, completion text)]) of a 2-step run over the 4 rows (each prompt once,
    2 completions each)."""
    seen = []

    def recording_reward(completions, db_id, **kwargs):
        seen.extend(zip(db_id, [c[-1]["content"] for c in completions], strict=True))
        return [0.0] * len(completions)

    def zero_reward(completions, **kwargs):
        return [0.0] * len(completions)

    params = _grpo_params(
        steps=2,
        batch_size=4,
        num_generations=2,
        max_completion_length=12,
        save_steps=100,
        constrained=constrained,
    )
    folder = tmp_path / ("constrained" if constrained else "free")
    metrics = train_grpo(
        params,
        0,
        tiny_sft,
        rows,
        folder / "adapter",
        [recording_reward, zero_reward],  # the smoke profile weighs two rewards
        checkpoint_dir=folder / "ckpt",
        dvclive_dir=None,
        spider_dir=SPIDER_DIR,
    )
    return metrics, seen


@pytest.fixture(scope="module")
def mixed(rows):
    """Two prompts on the first row's database, two whose db_id tables.json lacks."""
    assert rows[0]["db_id"] == rows[1]["db_id"]
    return [rows[0], rows[1], dict(rows[2], db_id=ABSENT), dict(rows[3], db_id=ABSENT)]


def _refused(seen, db_id):
    """The completions on db_id that its grammar refuses (not even a prefix of a query)."""
    matcher = matcher_for(load_schemas(SPIDER_DIR / "tables.json")[db_id])
    refused = []
    for db, text in seen:
        if db == db_id:
            matcher.reset()
            if not matcher.accept_string(text):
                refused.append(text)
    return refused


def test_constrained_rollouts_name_only_the_schema(mixed, tiny_sft, tmp_path, caplog):
    db_id = mixed[0]["db_id"]
    with caplog.at_level(logging.WARNING, logger="sqlrl.train.constrained"):
        metrics, seen = _run(mixed, tiny_sft, tmp_path, constrained=True)
    on_db = [text for db, text in seen if db == db_id]
    assert len(on_db) == 4 and len(seen) == 8
    # every completion is a prefix of a query over its database: no name it lacks
    assert _refused(seen, db_id) == []
    assert all(text.strip() for text in on_db)  # the grammar does not let a rollout end empty
    assert metrics["constrained"] == {
        "grammar_rollouts": 4,
        "fallback_rollouts": 4,
        "fallback_reasons": {"no schema for the database in tables.json": 4},
        "dead_ends": 0,  # a byte-level vocabulary spells whatever the grammar needs
    }
    warned = [r.getMessage() for r in caplog.records if ABSENT in r.getMessage()]
    assert len(warned) == 1 and "sample unconstrained" in warned[0]  # once per database
    # the per-batch shares in TRL's log (the curves): half of each step's rollouts constrained
    assert metrics["logged_steps"] == 2

    free_metrics, free = _run(mixed, tiny_sft, tmp_path, constrained=False)
    assert "constrained" not in free_metrics  # off: the metrics are what they were
    assert _refused(free, db_id)  # the same model unconstrained writes what the grammar refuses


def test_rows_whose_schema_yields_no_grammar_fall_back_with_their_reason(caplog):
    bad = Schema("odd", (Table("t\x01", (Column("a", "text", False),)),), ())
    empty = Schema("empty", (), ())
    good = Schema("ok", (Table("t", (Column("a", "text", False),)),), ())
    schemas = {s.db_id: s for s in (bad, empty, good)}
    grammars = RolloutGrammars(schemas, checked_grammar_text, "t.json")  # vLLM's: the text
    inputs = [{"db_id": d} for d in ("odd", "ok", "empty", "ok", "gone")]
    with caplog.at_level(logging.WARNING, logger="sqlrl.train.constrained"):
        constraint = grammars(inputs)
        assert [g is not None for g in constraint.rows] == [False, True, False, True, False]
        assert constraint.processor is None  # vLLM's: no processor, no dead-end count
        shares = constraint.generated()
    assert shares == {"constrained/grammar_share": 0.4, "constrained/fallback_share": 0.6}
    summary = grammars.summary()
    assert (summary["grammar_rollouts"], summary["fallback_rollouts"]) == (2, 3)
    assert summary["dead_ends"] is None
    reasons = summary["fallback_reasons"]
    assert sum(reasons.values()) == 3 and "no schema for the database in t.json" in reasons
    assert any("control character" in r for r in reasons)
    assert any("has no tables" in r for r in reasons)


def test_params_refuse_what_trl_cannot_constrain_per_prompt():
    with pytest.raises(ParamsError, match="grpo.constrained covers the sql/reasoning answer"):
        fixed_params("grpo.rollout=agent", "base.tokenizer=qwen2.5", "grpo.constrained=true")
    with pytest.raises(ParamsError, match="vllm_mode server"):
        fixed_params("grpo.use_vllm=true", "grpo.vllm_mode=server", "grpo.constrained=true")
    with pytest.raises(ParamsError, match="tensor_parallel_size 2"):
        fixed_params(
            "grpo.use_vllm=true", "grpo.vllm_tensor_parallel_size=2", "grpo.constrained=true"
        )
    assert fixed_params("grpo.use_vllm=true", "grpo.constrained=true").grpo.constrained
