"""The agent rollout through TRL 1.16's real GRPOTrainer: a tool call, its execution in our
environment, the final answer's reward, and what the loss sees of the tool's result.

What is real: sqlrl.train.grpo.train_grpo (the stage's training) with grpo.rollout=agent on a
tiny random Qwen2 with Qwen2.5's real tokenizer and chat template (tools branch); TRL's
tokenization, rendering of the tool schema, transformers generation path (EOS masking),
response parsing (the Qwen template's response schema), tool-calling loop, tool_mask, reward
calls and loss. What is scripted: the tokens the model emits (a random model never writes a
tool call): the model's own `generate` is replaced, in this test only, by one that reads the
rendered conversation and answers with a tool call first, then, after the tool's result, with
the question's gold SQL.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from sqlrl.train.grpo import train_grpo
from sqlrl.train.rewards import reward_functions
from tests.repo_tools import department_rows, fixed_params

PROBE = "SELECT count(*) FROM head"


@pytest.fixture(scope="module")
def rows(spider_dir):
    return department_rows(spider_dir)


def scripted_generate(tokenizer, rows, transcripts, turns=None):
    """A `generate` for the test: per row of the batch, a tool call when the conversation has
    no tool result yet, else the gold SQL of the question the prompt asks. `turns` (a list)
    gets, per call, the max_new_tokens it asked for and each row's text and token count."""
    golds = {r["question"]: r["gold_sql"] for r in rows}
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, input_ids=None, attention_mask=None, **kwargs):
        replies = []
        if turns is not None:
            turns.append((kwargs["generation_config"].max_new_tokens, []))
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            text = tokenizer.decode(ids[mask.bool()])
            transcripts.append(text)
            if turns is not None:
                turns[-1][1].append((text, int(mask.sum())))
            if "<tool_response>" not in text:
                call = {"name": "execute_sql", "arguments": {"query": PROBE}}
                reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
            else:
                (gold,) = [g for q, g in golds.items() if f"Question: {q}" in text]
                reply = f"```sql\n{gold}\n```"
            replies.append(tokenizer.encode(reply, add_special_tokens=False) + [end])
        width = max(map(len, replies))
        tail = torch.tensor([r + [end] * (width - len(r)) for r in replies])
        return torch.cat([input_ids, tail.to(input_ids.device)], dim=1)

    return generate


def train_one_agent_step(rows, model, spider_dir, tmp_path, max_completion_length=128):
    """The grpo stage's train_grpo, agent format: one step of 2 questions x 2 completions."""
    params = fixed_params("grpo.rollout=agent", "base.tokenizer=qwen2.5").grpo
    params = dataclasses.replace(
        params,
        steps=1,
        batch_size=4,
        prompts_per_step=2,
        num_generations=2,
        max_completion_length=max_completion_length,
        save_steps=100,
    )
    return train_grpo(
        params,
        0,
        model,
        rows,
        tmp_path / "adapter",
        reward_functions(params, spider_dir),
        checkpoint_dir=tmp_path / "ckpt",
        dvclive_dir=None,
        torch_threads=1,
    )


def test_a_tool_call_runs_in_the_environment_and_its_result_is_masked_from_the_loss(
    rows, tiny_qwen, spider_dir, tmp_path, monkeypatch
):
    import trl
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    transcripts, seen = [], []
    monkeypatch.setattr(
        Qwen2ForCausalLM, "generate", scripted_generate(tokenizer, rows, transcripts)
    )
    own_compute_loss = trl.GRPOTrainer.compute_loss

    def recording_compute_loss(self, model, inputs, *args, **kwargs):
        seen.append({k: inputs.get(k) for k in ("completion_ids", "completion_mask", "tool_mask")})
        return own_compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(trl.GRPOTrainer, "compute_loss", recording_compute_loss)
    metrics = train_one_agent_step(rows, tiny_qwen, spider_dir, tmp_path)
    # the prompt offered the tool (TRL rendered its schema from execute_sql's docstring)
    first = transcripts[0]
    assert '"name": "execute_sql"' in first and "<tools>" in first
    # every rollout called the tool once, and the environment ran it on the row's database
    second_turns = [t for t in transcripts if "<tool_response>" in t]
    assert len(second_turns) == 4
    assert all("(1 row)\ncount(*)\n10" in t for t in second_turns)
    assert metrics["tool_calls_per_episode"] == 1.0
    assert metrics["failed_tool_call_share"] == 0.0 and metrics["no_answer_share"] == 0.0
    # the execution reward judged the final answer, given after the tool's result: all right
    assert metrics["final_mean_reward"] == 1.0
    # the loss sees the call and the answer, never the tool's result
    (batch,) = seen
    ids, completion_mask, tool_mask = (
        batch[k] for k in ("completion_ids", "completion_mask", "tool_mask")
    )
    assert tool_mask is not None
    for row_ids, row_completion, row_tool in zip(ids, completion_mask, tool_mask, strict=True):
        trained = tokenizer.decode(row_ids[(row_completion * row_tool).bool()])
        masked = tokenizer.decode(row_ids[(row_completion * (1 - row_tool)).bool()])
        assert trained.startswith("<tool_call>\n") and "```sql\nSELECT" in trained
        assert "<tool_response>" not in trained and "count(*)\n10" not in trained
        assert "<tool_response>\n(1 row)\ncount(*)\n10\n</tool_response>" in masked
        assert "execute_sql" not in masked and "SELECT" not in masked


def test_the_turn_after_a_tool_result_asks_only_for_the_budget_left(
    rows, tiny_qwen, spider_dir, tmp_path, monkeypatch
):
    """TRL 1.16 asks every turn of the tool loop for the whole max_completion_length and trims
    the turn afterwards; the stage asks the turn after a tool result for what its episode has
    left (sqlrl.patches.per_turn_completion_budget): the budget less the call and the result."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    turns = []
    monkeypatch.setattr(Qwen2ForCausalLM, "generate", scripted_generate(tokenizer, rows, [], turns))
    metrics = train_one_agent_step(rows, tiny_qwen, spider_dir, tmp_path, 128)
    assert metrics["tool_calls_per_episode"] == 1.0 and metrics["final_mean_reward"] == 1.0
    (first_asked, first), (second_asked, second) = turns
    assert first_asked == 128 and len(first) == len(second) == 4
    prompt_tokens = dict(first)
    left = []
    for text, length in second:
        (prompt,) = [p for p in prompt_tokens if text.startswith(p)]
        left.append(128 - (length - prompt_tokens[prompt]))  # less the call and its result
    # every episode made the same call and got the same result: one budget left for the turn
    assert len(set(left)) == 1 and 0 < left[0] < 100
    assert second_asked == left[0]
