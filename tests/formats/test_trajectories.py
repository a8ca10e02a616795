"""SFT rows in grpo.rollout's format (the formats' sft_formatter, sqlrl/formats/) and what SFT trains on in
them: the agent's tool call and answer, never the tool's answer.

Real: Spider's department_management database and rows as prepare writes them, the GRPO
environment's execute_sql, Qwen2.5's tokenizer and template, TRL's SFTTrainer on a tiny
random Qwen2 (its tokenization, its training template for assistant_only_loss, our loss).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest
import torch

from sqlrl.data.prompts import normalize_sql_whitespace
from sqlrl.data.spider import load_examples, load_schemas
from sqlrl.formats import get_format
from sqlrl.formats.agent import AGENT_SYSTEM_PROMPT, probe_query
from sqlrl.formats.reasoning import answer_sql, reasoning_format_score
from tests.repo_tools import fixed_params, grpo_rows


@pytest.fixture(scope="module")
def rows(spider_dir):
    """Four department_management questions: (GRPO rows, SFT rows) as prepare writes them,
    plus one schema-grounding copy (a renamed table: no database answers for it)."""
    schemas = load_schemas(spider_dir / "tables.json")
    examples = load_examples(spider_dir / "train_spider.json", schemas)
    grpo = grpo_rows(spider_dir, [e for e in examples if e.db_id == "department_management"][:4])
    sft = [
        {
            "prompt": r["prompt"],
            "completion": [
                {"role": "assistant", "content": normalize_sql_whitespace(r["gold_sql"])}
            ],
            "db_id": r["db_id"],
        }
        for r in grpo
    ]
    copy = json.loads(json.dumps(sft[0]))
    copy["completion"][0]["content"] = "SELECT count(*) FROM chief WHERE age > 56"
    return grpo, sft + [copy]


def _formatted(rows, *overrides):
    grpo, sft = rows
    sft = json.loads(json.dumps(sft))
    params = fixed_params(*overrides, "base.tokenizer=qwen2.5").grpo
    stats = get_format(params.rollout).sft_formatter(params).format_rows(sft, grpo)
    return sft, stats


def test_the_sql_format_leaves_the_rows_as_they_are(rows):
    sft, stats = _formatted(rows)
    assert stats == {} and sft == rows[1]


def test_an_agent_row_looks_at_the_main_table_sees_the_real_rows_then_answers(rows, spider_dir):
    grpo, _ = rows
    sft, stats = _formatted(rows, "grpo.rollout=agent", "grpo.agent.max_rows=2")
    assert stats == {"rollout": "agent", "rows": 5, "tool_calls": 4, "failed_tool_calls": 0}
    first = sft[0]
    assert first["prompt"][0] == {"role": "system", "content": AGENT_SYSTEM_PROMPT}
    assert [t["function"]["name"] for t in first["tools"]] == ["execute_sql"]
    call, tool, answer = first["completion"]
    query = call["tool_calls"][0]["function"]["arguments"]["query"]
    assert query == probe_query(grpo[0]["gold_sql"]) == "SELECT * FROM head LIMIT 3"
    # the observation is the database's, bounded as GRPO's tool bounds it (max_rows=2 of 3)
    with sqlite3.connect(
        spider_dir / "database/department_management/department_management.sqlite"
    ) as db:
        cursor = db.execute(query)
        names = [d[0] for d in cursor.description]
        shown = cursor.fetchall()[:2]
    expected = "\n".join(
        ["(3 rows, first 2 shown)", " | ".join(names)]
        + [" | ".join(str(v) for v in row) for row in shown]
    )
    assert tool == {"role": "tool", "name": "execute_sql", "content": expected}
    assert answer == {"role": "assistant", "content": normalize_sql_whitespace(grpo[0]["gold_sql"])}
    # the copy (renamed schema, no database) answers at once, in the same format
    assert sft[-1]["completion"] == [rows[1][-1]["completion"][0]]
    assert sft[-1]["tools"] == first["tools"]


def test_a_reasoning_row_has_the_shape_the_format_reward_pays_for(rows):
    grpo, _ = rows
    sft, stats = _formatted(rows, "grpo.rollout=reasoning")
    assert stats == {"rollout": "reasoning", "rows": 5}
    for row, gold in zip(sft, [r["gold_sql"] for r in grpo], strict=False):
        assert reasoning_format_score(row["completion"]) == 1.0
        assert answer_sql(row["completion"]) == normalize_sql_whitespace(gold)
    assert "head" in sft[0]["completion"][0]["content"].split("</think>")[0]


def test_the_agent_prompt_is_the_one_grpo_renders(rows, tiny_qwen):
    """SFT's rendering of an agent row (its `tools` schemas) is TRL's GRPO rendering of the
    same prompt (the environment's bound methods), token for token."""
    from transformers import AutoTokenizer

    from sqlrl.formats.sql_environment import SQLEnvironment

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    row = _formatted(rows, "grpo.rollout=agent")[0][0]
    as_sft = tokenizer.apply_chat_template(
        row["prompt"], tools=row["tools"], add_generation_prompt=True, tokenize=False
    )
    as_grpo = tokenizer.apply_chat_template(
        row["prompt"],
        tools=[SQLEnvironment().execute_sql],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert as_sft == as_grpo and "<tools>" in as_sft


@pytest.mark.slow  # ~1-4 min on 2 busy cores: Qwen2.5's 152k-token output layer
@pytest.mark.parametrize("completion_only_loss", [False, True])
def test_sft_trains_the_call_and_the_answer_never_the_tools_answer(
    rows, tiny_qwen, tmp_path, monkeypatch, completion_only_loss
):
    """Through the stage's train_sft: the batch compute_loss gets, and the weight each token
    has in the loss. Prompt trained (the smoke profile's weight 0.1): the prompt weighs 0.1,
    the call and the answer 1, the tool's answer 0. Completion only (the reference's): only
    the call and the answer are targets (TRL's own loss)."""
    import trl
    from transformers import AutoTokenizer

    from sqlrl.train import sft as sft_module
    from sqlrl.train.sft import _weighted_loss_trainer_class, train_sft

    sft, _ = _formatted(rows, "grpo.rollout=agent")
    sft = sft[:2] + sft[-1:]  # two trajectories and the copy's direct answer: 152k logits a token
    golds = {normalize_sql_whitespace(r["gold_sql"]) for r in rows[0][:2]}
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in sft))
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    seen = []
    weighted = _weighted_loss_trainer_class()
    own = weighted.compute_loss if not completion_only_loss else trl.SFTTrainer.compute_loss

    def recording(self, model, inputs, *args, **kwargs):
        seen.append((self, {k: v.clone() for k, v in inputs.items() if hasattr(v, "clone")}))
        return own(self, model, inputs, *args, **kwargs)

    target = weighted if not completion_only_loss else trl.SFTTrainer
    monkeypatch.setattr(target, "compute_loss", recording)
    monkeypatch.setattr(sft_module, "_weighted_loss_trainer_class", lambda: weighted)
    params = dataclasses.replace(
        fixed_params().sft,
        completion_only_loss=completion_only_loss,
        prompt_loss_weight=0.1,
        epochs=1,
        batch_size=3,
        rows_per_step=3,
        max_length=1024,
        group_by_length=False,
        save_steps=0,
    )
    metrics = train_sft(params, 0, tiny_qwen, data, tmp_path / "out", None, torch_threads=1)
    assert metrics["tool_turns_masked"] is True and metrics["rows_trained"] == 3
    ((trainer, batch),) = seen
    ids, labels = batch["input_ids"], batch["labels"]
    decoded = [tokenizer.decode(row) for row in ids]
    trajectories = [i for i, text in enumerate(decoded) if "<tool_response>" in text]
    assert len(trajectories) == 2  # the batch is shuffled: found by content
    for i in trajectories:
        targets = tokenizer.decode(ids[i][labels[i] != -100])
        assert targets.startswith("<tool_call>\n") and "</tool_call><|im_end|>" in targets
        assert "SELECT * FROM head LIMIT 3" in targets
        assert any(f"\n{gold}<|im_end|>" in targets for gold in golds)
        assert "<tool_response>" not in targets and "Tiger Woods" not in targets
    if completion_only_loss:
        assert type(trainer) is trl.SFTTrainer  # TRL's loss over its labels: as above
        return
    mask, _, weights, _ = trainer._weights(batch)
    weight = torch.zeros(mask.shape)
    weight[mask] = weights.float()  # each position's weight in the loss (0: none)
    shifted = ids[:, 1:]  # the tokens predicted at those positions
    real = batch["attention_mask"][:, 1:].bool()
    for i in trajectories:
        assert {round(float(w), 3) for w in weight[i][real[i]]} == {0.0, 0.1, 1.0}
        prompt = tokenizer.decode(shifted[i][(weight[i] - 0.1).abs() < 1e-6])
        trained = tokenizer.decode(shifted[i][weight[i] == 1.0])
        environment = tokenizer.decode(shifted[i][real[i] & (weight[i] == 0)])
        assert "Question:" in prompt and "<tools>" in prompt and "<tool_response>" not in prompt
        assert trained == tokenizer.decode(ids[i][labels[i] != -100])
        assert environment.startswith("<|im_start|>user\n<tool_response>\n(3 rows)\n")
        assert "Tiger Woods" in environment and "SELECT" not in environment
