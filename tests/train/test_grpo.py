"""GRPO: prompt selection, reward wiring on a tiny model, the metrics, and the merge."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch

from sqlrl.params import compose_params, params_from_dict
from sqlrl.sql.executor import SQLExecutor
from sqlrl.train.grpo import StepTimer, summarize_log, train_grpo
from sqlrl.train.grpo_prompts import select_prompts
from sqlrl.train.merge import merge_adapter
from sqlrl.train.rewards import make_rewards, reward_functions
from tests.repo_tools import SPIDER_DIR


def _grpo_params(**changes):
    base = params_from_dict(compose_params("smoke")).grpo
    return dataclasses.replace(base, **changes)


def test_empty_gold_results_are_dropped_and_counted(rows):
    empty = dict(rows[0], gold_sql="SELECT * FROM head WHERE age > 10000")
    zero = dict(rows[2], gold_sql="SELECT count(*) FROM head WHERE age > 10000")
    broken = dict(rows[1], gold_sql="SELECT nothing FROM nowhere")
    kept, stats = select_prompts(
        [empty, zero, broken, *rows[3:6]], _grpo_params(), 0, SQLExecutor()
    )
    assert (stats.candidates, stats.dropped_empty_gold, stats.dropped_gold_error) == (6, 2, 1)
    assert stats.kept == len(kept) == 3 and not {id(empty), id(zero), id(broken)} & set(
        map(id, kept)
    )


def test_pass_rate_filter_keeps_prompts_solved_sometimes_but_not_always(rows):
    params = _grpo_params(
        drop_empty_gold=False,
        pass_rate_filter=dataclasses.replace(
            _grpo_params().pass_rate_filter, pool=4, min_rate=0.1, max_rate=0.9
        ),
    )
    rates = {
        r["gold_sql"]: rate for r, rate in zip(rows, [0.0, 0.5, 1.0, 0.25, 0.75], strict=False)
    }
    kept, stats = select_prompts(
        rows[:5], params, 0, SQLExecutor(), lambda pool: [rates[r["gold_sql"]] for r in pool]
    )
    assert stats.pass_rate_pool == 4
    assert all(0.1 <= rates[r["gold_sql"]] <= 0.9 for r in kept)
    assert stats.kept == len(kept) == 4 - stats.dropped_always_solved - stats.dropped_never_solved


def test_selection_that_keeps_nothing_says_so(rows):
    params = _grpo_params(
        pass_rate_filter=dataclasses.replace(_grpo_params().pass_rate_filter, pool=3)
    )
    with pytest.raises(ValueError, match="kept no prompt"):
        select_prompts(rows[:3], params, 0, SQLExecutor(), lambda pool: [1.0] * len(pool))


def test_reward_wiring_on_a_tiny_model(rows, tiny_sft, tmp_path, monkeypatch):
    """TRL calls our reward with the dataset's columns; rewards are logged and summarised;
    each rollout batch runs one prefill per prompt (TRL puts a group's copies in a row)."""
    import sqlrl.model.generate

    runs = []
    repeated_rows = sqlrl.model.generate.repeated_rows
    monkeypatch.setattr(
        sqlrl.model.generate,
        "repeated_rows",
        lambda *a: runs.append(repeated_rows(*a)[1]) or repeated_rows(*a),
    )
    execution_reward, syntax_reward = make_rewards(workers=1, backend="thread")
    seen = []

    def recording_reward(completions, db_path, gold_sql, **kwargs):
        seen.append((len(completions), list(db_path), list(gold_sql)))
        assert len(kwargs["db_id"]) == len(kwargs["question"]) == len(completions)  # for repair
        time.sleep(0.002)  # a reward of known cost: the summary's reward seconds must see it
        return execution_reward(completions, db_path=db_path, gold_sql=gold_sql, **kwargs)

    recording_reward.__name__ = "execution_reward"

    params = _grpo_params(
        steps=2, batch_size=4, num_generations=2, max_completion_length=8, save_steps=100
    )
    metrics = train_grpo(
        params,
        0,
        tiny_sft,
        rows[:4],
        tmp_path / "adapter",
        [recording_reward, syntax_reward],
        checkpoint_dir=tmp_path / "ckpt",
        dvclive_dir=str(tmp_path / "dvclive"),
    )
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "adapter.tmp").exists()
    assert seen and all(n == 4 for n, _, _ in seen)
    assert runs and all(lengths == [2, 2] for lengths in runs)  # 2 prompts x 2 generations
    known = {(r["db_path"], r["gold_sql"]) for r in rows[:4]}
    assert all(set(zip(paths, golds, strict=False)) <= known for _, paths, golds in seen)
    assert metrics["steps"] == 2 and metrics["logged_steps"] == 2
    # a random 400-token model never writes SQL that returns the gold result: every reward the
    # trainer logged is 0, and so is every group's spread (a miswired reward would show here)
    assert metrics["final_mean_reward"] == metrics["peak_reward"] == 0.0
    assert metrics["mean_frac_reward_zero_std"] == 1.0
    assert metrics["seconds_per_step"]["reward"] >= 0.002  # the sleep above, counted
    reward_curve = tmp_path / "dvclive" / "plots" / "metrics" / "reward.tsv"
    assert len(reward_curve.read_text().splitlines()) == 3  # header + one row per step


def _adapter_weights(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_grpo_seed_still_rules_after_a_colocated_vllm_engine_reseeds_the_process(
    rows, tiny_sft, tmp_path, monkeypatch
):
    """In colocate mode TRL builds the vLLM engine inside the trainer, and vLLM's worker seeds
    random, numpy and torch with the engine's seed (0) as it starts. A stand-in trainer does
    the same at the end of its constructor: the run must still train exactly as grpo's seed
    says (the same adapter as a run without the reset), not as seed 0 would. The reward is the
    completion's length, so every sampled token moves the adapter."""
    import random
    import types

    import numpy as np
    import trl

    def length_reward(completions, **kwargs):
        return [float(len(c[-1]["content"])) for c in completions]

    def run(folder, trainer_class, seed=7):
        monkeypatch.setattr(trl, "GRPOTrainer", trainer_class)
        train_grpo(
            _grpo_params(steps=2, batch_size=4, num_generations=2, max_completion_length=8),
            seed,
            tiny_sft,
            rows[:4],
            folder,
            [length_reward, length_reward],  # grpo.reward_weights has two
            checkpoint_dir=tmp_path / f"{folder.name}_ckpt",
            dvclive_dir=None,
        )
        return _adapter_weights(folder)

    class ColocatedEngineTrainer(trl.GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.vllm_generation = types.SimpleNamespace(mode="colocate")  # TRL's engine holder
            random.seed(0)  # what vllm/v1/worker/gpu_worker.py's set_random_seed(0) does
            np.random.seed(0)
            torch.manual_seed(0)

    plain = run(tmp_path / "plain", trl.GRPOTrainer)
    reset = run(tmp_path / "reset", ColocatedEngineTrainer)
    assert plain.keys() == reset.keys()
    assert all(torch.equal(plain[k], reset[k]) for k in plain)
    seed0 = run(tmp_path / "seed0", ColocatedEngineTrainer, seed=0)  # the seed vLLM imposes
    assert not all(torch.equal(plain[k], seed0[k]) for k in plain)  # the seed matters here


def test_summary_of_a_log_history():
    history = [
        {"reward": r, "loss": 0.1 * i, "frac_reward_zero_std": 0.5, "completions/mean_length": 10.0}
        for i, r in enumerate([0.0] * 10 + [1.0] * 10)
    ]
    timer = StepTimer()
    summary = summarize_log(history, timer, steps=20, wall_s=40.0)
    assert (summary["first_mean_reward"], summary["final_mean_reward"]) == (0.0, 1.0)
    assert summary["peak_reward"] == 1.0 and summary["final_loss"] == pytest.approx(1.9)
    assert summary["seconds_per_step"]["total"] == 2.0
    json.dumps(summary, allow_nan=False)


def test_merged_model_matches_base_plus_adapter(tiny_sft, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_sft)
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    get_peft_model(model, config).save_pretrained(tmp_path / "adapter")
    merge_adapter(tiny_sft, tmp_path / "adapter", tmp_path / "final")

    assert not (tmp_path / "final" / "adapter_config.json").exists()
    assert (tmp_path / "final" / "model.safetensors").is_file()
    assert (tmp_path / "final" / "tokenizer_config.json").is_file()
    ids = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tiny_sft), tmp_path / "adapter"
        )(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final")(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_sft)(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-4)
    assert not torch.allclose(merged, plain, atol=1e-4)  # the adapter really changed something


def test_merge_keeps_the_sft_models_dtype(tiny_sft, tmp_path):
    """A bf16 SFT model (the reference) merges into a bf16 final model, half the size of fp32."""
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bf16 = tmp_path / "sft_bf16"
    AutoModelForCausalLM.from_pretrained(tiny_sft, dtype=torch.bfloat16).save_pretrained(bf16)
    AutoTokenizer.from_pretrained(tiny_sft).save_pretrained(bf16)
    model = AutoModelForCausalLM.from_pretrained(bf16)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(tmp_path / "adapter")
    info = merge_adapter(bf16, tmp_path / "adapter", tmp_path / "final")
    assert info["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "final" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def test_use_vllm_without_vllm_falls_back_to_transformers_with_a_warning(
    tmp_path, caplog, monkeypatch
):
    from sqlrl.train.grpo import grpo_config

    monkeypatch.setitem(__import__("sys").modules, "vllm", None)  # `import vllm` fails
    config = grpo_config(_grpo_params(use_vllm=True), 0, str(tmp_path))
    assert config.use_vllm is False
    assert "vLLM is not installed" in caplog.text


def test_gradient_accumulation_gives_the_recipes_questions_per_step(tmp_path):
    """TRL generates per-device batch x accumulation completions per process per step: the
    recipe's prompts_per_step x num_generations in one generation round."""
    from sqlrl.train.grpo import grpo_config

    params = _grpo_params(batch_size=8, prompts_per_step=16, num_generations=8)
    config = grpo_config(params, 0, str(tmp_path))
    assert config.generation_batch_size == 128 and config.steps_per_generation == 16


@pytest.mark.parametrize("world", [1, 4, 8])
def test_the_reference_step_takes_the_same_questions_on_any_number_of_gpus(world, tmp_path):
    """grpo.prompts_per_step and sft.rows_per_step belong to the recipe: with 4 or 8
    processes each takes a share, so 300 steps still draw 300 x 16 questions (per-process
    accumulation used to multiply them by the GPU count)."""
    from sqlrl.train.grpo import grpo_config
    from sqlrl.train.sft import sft_config

    params = params_from_dict(compose_params("qwen2.5-coder-3b", [f"launch.num_processes={world}"]))
    grpo = grpo_config(dataclasses.replace(params.grpo, use_vllm=False), 0, str(tmp_path), world)
    completions = grpo.per_device_train_batch_size * grpo.gradient_accumulation_steps * world
    assert completions == 16 * 8 == params.grpo.prompts_per_step * params.grpo.num_generations
    assert grpo.per_device_train_batch_size <= params.grpo.batch_size  # memory stays bounded
    sft = sft_config(params.sft, 0, str(tmp_path), world)
    assert sft.per_device_train_batch_size * sft.gradient_accumulation_steps * world == 16


def test_a_step_that_does_not_split_over_the_processes_is_refused():
    from sqlrl.params import ParamsError

    with pytest.raises(
        ParamsError, match=r"sft.rows_per_step \(16\) .* divisible by the 3 training"
    ):
        params_from_dict(compose_params("qwen2.5-coder-3b", ["launch.num_processes=3"]))


def test_every_rollout_sampling_and_vllm_setting_comes_from_params(tmp_path, monkeypatch):
    """None of them is left to TRL's defaults (vLLM's 0.3 of the GPU and a 32k context were
    TRL's choices, not ours): values unlike TRL's defaults reach GRPOConfig unchanged."""
    import sqlrl.train.grpo as grpo

    monkeypatch.setattr(grpo, "use_vllm", lambda params: params.use_vllm)  # no vLLM here
    settings = dict(
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        vllm_gpu_memory_utilization=0.45,
        vllm_max_model_length=3000,
        vllm_enable_sleep_mode=True,
        vllm_tensor_parallel_size=2,
    )
    params = _grpo_params(use_vllm=True, **settings)
    config = grpo.grpo_config(params, 0, str(tmp_path))
    assert {k: getattr(config, k) for k in settings} == settings
    reference = params_from_dict(compose_params("qwen2.5-coder-3b")).grpo
    assert reference.vllm_max_model_length == 2048 + reference.max_completion_length
    assert grpo.grpo_config(_grpo_params(min_p=0.0), 0, str(tmp_path)).min_p is None  # off


def test_with_vllm_rollouts_dropout_is_off_and_without_it_as_before(tmp_path, monkeypatch):
    """With vLLM, TRL scores each rollout again with the policy for its importance-sampling
    weights exp(policy - vLLM); LoRA dropout in that pass made them noise (measured on the CPU
    build: per-token |log-prob gap| 0.0052 with dropout 0.05, 0.0006 without;
    docs/rollouts.md). Transformers rollouts (the CPU default) keep the adapter's dropout."""
    import sqlrl.train.grpo as grpo

    monkeypatch.setattr(grpo, "use_vllm", lambda params: params.use_vllm)  # no vLLM here
    assert grpo.grpo_config(_grpo_params(use_vllm=True), 0, str(tmp_path)).disable_dropout
    assert not grpo.grpo_config(_grpo_params(use_vllm=False), 0, str(tmp_path)).disable_dropout


def test_importance_sampling_statistics_reach_the_metrics_only_where_trl_logs_them():
    logged = [
        {
            "reward": 0.5,
            "sampling/importance_sampling_ratio/min": 0.98 - i / 100,
            "sampling/importance_sampling_ratio/mean": 1.0,
            "sampling/importance_sampling_ratio/max": 1.01 + i / 100,
            "sampling/sampling_logp_difference/mean": 0.001 * (i + 1),
            "sampling/sampling_logp_difference/max": 0.004,
        }
        for i in range(3)
    ]
    summary = summarize_log(logged, StepTimer(), steps=3, wall_s=3.0)
    assert summary["importance_sampling"] == {
        "ratio_min": 0.96,
        "ratio_mean": 1.0,
        "ratio_max": 1.03,
        "logp_difference_mean": 0.002,
        "logp_difference_max": 0.004,
    }
    plain = summarize_log([{"reward": 0.5}], StepTimer(), steps=1, wall_s=1.0)
    assert "importance_sampling" not in plain  # transformers rollouts: metrics/grpo.json as before


def test_the_policys_frozen_weights_survive_many_weight_syncs(tiny_sft, tmp_path):
    """With vLLM, TRL pushes weights every step by merging the LoRA adapter into the frozen
    weights and unmerging it. GRPO's policy keeps those weights in fp32, where 100 cycles
    return them to within fp32 rounding; a bf16 policy (what loading the bf16 SFT model in its
    own dtype gave) drifts by a large share of the weights' size (TRL issue #6688)."""
    from peft import get_peft_model

    from sqlrl.model.modeling import load_model_and_tokenizer, lora_config
    from sqlrl.train.grpo import load_policy

    bf16_sft = tmp_path / "sft_bf16"  # the reference's SFT model is saved in bf16
    model, tokenizer = load_model_and_tokenizer(tiny_sft)
    model.to(torch.bfloat16).save_pretrained(bf16_sft)
    tokenizer.save_pretrained(bf16_sft)

    def drift_after_syncs(policy, cycles=100) -> float:
        peft_model = get_peft_model(policy, lora_config(_grpo_params().lora))
        torch.manual_seed(0)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:  # a trained adapter: B is no longer zero
                param.data.normal_(0.0, 0.05)
        frozen = {
            n: p.detach().clone() for n, p in peft_model.named_parameters() if "base_layer" in n
        }
        for _ in range(cycles):
            peft_model.merge_adapter()
            peft_model.unmerge_adapter()
        after = dict(peft_model.named_parameters())
        return max(
            float((after[n].float() - w.float()).abs().max() / w.float().abs().mean())
            for n, w in frozen.items()
        )

    policy, _ = load_policy(bf16_sft)
    assert next(policy.parameters()).dtype == torch.float32
    assert drift_after_syncs(policy) < 1e-4
    bf16_policy, _ = load_model_and_tokenizer(bf16_sft, dtype="bfloat16")
    assert drift_after_syncs(bf16_policy) > 1e-2  # what the fp32 policy avoids


def test_pass_rate_counts_solved_samples_not_partial_credit():
    from sqlrl.train.grpo_prompts import sampled_pass_rates

    class Fixed:
        def sample(self, prompts, n, temperature, seed):
            return [["a"] * n for _ in prompts]

    class Template:
        def apply_chat_template(self, messages, **kwargs):
            return "p"

    rates = sampled_pass_rates(
        [{"prompt": [], "gold_sql": "x", "db_path": "d"}],
        Fixed(),
        Template(),
        4,
        1.0,
        0,
        lambda completions, **kw: [1.0, 0.1, 0.1, 0.0],
    )
    assert rates == [0.25]


def test_on_a_cpu_only_completion_tokens_are_scored_with_the_same_log_probs(tiny_sft, monkeypatch):
    """TRL's fused head scores every position without Triton; the pipeline makes it score only
    the completion tokens on a CPU (the prompt is most of a GRPO row), with equal log-probs."""
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.kernels.chunked_logprob import _use_triton as stock

    from sqlrl.patches import completion_logits_only_on_cpu

    model = AutoModelForCausalLM.from_pretrained(tiny_sft)
    trl_utils.add_fused_lm_head(model)
    ids = torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :9] = -100  # a 9-token prompt, 3 completion tokens per row
    scored = []
    apply = trl_utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(
        trl_utils._ChunkedLogProbFunction,
        "apply",
        staticmethod(lambda hidden, *a: scored.append(len(hidden)) or apply(hidden, *a)),
    )

    def log_probs():
        with torch.no_grad():
            return model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                labels=labels,
                fused_lm_head=True,
            ).log_probs

    monkeypatch.setattr(trl_utils, "_use_triton", stock)
    every_position = log_probs()
    with completion_logits_only_on_cpu():
        completions_only = log_probs()
    assert trl_utils._use_triton is stock  # only for the block
    assert scored == [2 * 11, 2 * 3]
    valid = labels[:, 1:] != -100
    torch.testing.assert_close(completions_only[valid], every_position[valid])
    assert (completions_only[~valid] == 0).all()


def test_resume_continues_only_a_run_of_the_same_params(rows, tiny_sft, tmp_path, capsys, caplog):
    """An interrupted run resumes from its checkpoint; after a params change the old run's
    checkpoint is not resumed (its result would be recorded as the new params' output)."""
    rewards = reward_functions(_grpo_params(), SPIDER_DIR)

    def run(**changes):
        params = _grpo_params(
            steps=2,
            batch_size=4,
            num_generations=2,
            max_completion_length=8,
            save_steps=1,
            **changes,
        )
        return train_grpo(
            params,
            0,
            tiny_sft,
            rows[:4],
            tmp_path / "adapter",
            rewards,
            checkpoint_dir=tmp_path / "ckpt",
            dvclive_dir=None,
        )

    assert run()["resumed_from"] is None
    assert run(resume=True)["resumed_from"] == "checkpoint-2"
    capsys.readouterr()
    changed = run(resume=True, learning_rate=1e-3)
    assert changed["resumed_from"] is None and changed["steps"] == 2
    assert "not resuming from" in caplog.text
    assert run(resume=True, learning_rate=1e-3)["resumed_from"] == "checkpoint-2"


def test_the_reasoning_rollout_trains_on_its_prompt_and_reports_its_format(
    rows, tiny_sft, tmp_path, spider_dir
):
    """grpo.rollout=reasoning: the trainer's prompts carry the reasoning system prompt (the
    rows as prepare wrote them otherwise), the format reward is weighted in by name, and
    metrics/grpo.json says how often the shape was right and how often no answer came (a
    random model: never right, never an answer). The sql rollout adds none of these keys."""
    from sqlrl.formats.reasoning import REASONING_SYSTEM_PROMPT
    from tests.repo_tools import fixed_params

    systems = []
    params = fixed_params("grpo.rollout=reasoning", "+grpo.reward_weights.format=0.5").grpo
    params = dataclasses.replace(
        params, steps=1, batch_size=4, num_generations=2, max_completion_length=8
    )
    execution, syntax, format_reward = reward_functions(params, spider_dir)

    def recording_format_reward(completions, prompts, **kwargs):
        systems.extend(p[0]["content"] for p in prompts)
        return format_reward(completions, **kwargs)

    recording_format_reward.__name__ = "format_reward"
    metrics = train_grpo(
        params,
        0,
        tiny_sft,
        rows[:4],
        tmp_path / "adapter",
        [execution, syntax, recording_format_reward],
        checkpoint_dir=tmp_path / "ckpt",
        dvclive_dir=None,
    )
    assert systems and set(systems) == {REASONING_SYSTEM_PROMPT}
    assert rows[0]["prompt"][0]["content"] == "SQL only."
    assert metrics["rollout"] == "reasoning"
    assert metrics["mean_format_reward"] == 0.0 and metrics["no_answer_share"] == 1.0
    assert "tool_calls_per_episode" not in metrics


def test_rollout_metrics_of_an_agent_run():
    from collections import Counter

    from sqlrl.formats.sql_environment import EpisodeStats
    from sqlrl.train.grpo import rollout_metrics

    def execution_reward():
        pass

    execution_reward.stats = Counter(ok=6, error=2, without_sql=2)
    agent = _grpo_params(rollout="agent")
    history = [{"rewards/format_reward/mean": 0.5}, {"rewards/format_reward/mean": 0.25}]
    stats = EpisodeStats(episodes=8, calls=12, failed_calls=3)
    assert rollout_metrics(agent, history, stats, [execution_reward]) == {
        "rollout": "agent",
        "mean_format_reward": 0.375,
        "tool_calls_per_episode": 1.5,
        "failed_tool_call_share": 0.25,
        "episodes": 8,
        "no_answer_share": 0.25,
    }
    assert rollout_metrics(_grpo_params(), history, stats, [execution_reward]) == {}
