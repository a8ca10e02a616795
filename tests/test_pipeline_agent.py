"""End to end: the smoke DAG with the agent format (grpo.rollout=agent), from prepare's
trajectories through SFT to GRPO's tool loop and the evaluations.

A whole DAG of its own: the shared smoke run (tests/test_pipeline.py) is the `sql` format, and
this one needs Qwen2.5's tokenizer for its tool-calling template. Kept small: 4 dev questions
per set and no voting (its evaluations only have to run), completions long enough for a call,
its observation and an answer, SFT rows long enough for a trajectory."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

AGENT = (
    "base.tokenizer=qwen2.5",
    "grpo.rollout=agent",
    "grpo.max_completion_length=128",
    "sft.max_length=768",  # a trajectory in Qwen2.5's tokens: up to 671 (smoke's 512 cuts 33)
    "prepare.max_dev_examples=4",
    "eval.vote_models=[]",
)


def test_the_agent_format_runs_end_to_end_and_the_model_calls_the_tool(tmp_path_factory):
    from tests.conftest import make_smoke_repo

    repo = make_smoke_repo(tmp_path_factory.mktemp("agent"), overrides=AGENT)

    def metrics(name: str) -> dict:
        return json.loads((repo / "metrics" / f"{name}.json").read_text())

    # prepare: every training question became a trajectory with a real observation
    assert metrics("prepare")["sft_format"] == {
        "rollout": "agent",
        "rows": 48,
        "tool_calls": 48,
        "failed_tool_calls": 0,
    }
    row = json.loads((repo / "data/prepared/sft.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in row["completion"]] == ["assistant", "tool", "assistant"]
    # sft: trained on them, the tool's answers out of the loss
    sft = metrics("sft")
    assert sft["tool_turns_masked"] is True and sft["rows_trained"] == 48
    # grpo: the SFT model learnt the call's format well enough for TRL to parse and run it
    grpo = metrics("grpo")
    assert grpo["rollout"] == "agent"
    assert grpo["episodes"] == grpo["steps"] * grpo["completions_per_step"]
    assert grpo["tool_calls_per_episode"] > 0
    for name in ("base", "sft", "final"):
        assert metrics(f"eval_{name}")["dev"]["n"] == 4
