"""GRPO with the execution reward: TRL's GRPOTrainer on the SFT model with a LoRA adapter.

The prompts come from the grpo_prompts stage (sqlrl/train/grpo_prompts.py); grpo.rollout picks
how completions answer (docs/rollouts.md), and its Format (sqlrl/formats/) what the trainer
gets for it: the agent's hands TRL the execute_sql environment and TRL runs the tool loop; the
default `sql` format passes the trainer exactly what it got before formats existed.
Rollouts use transformers generation, or vLLM where installed and asked for: colocated on the
training GPUs, or a separate server (grpo.vllm_mode: server, checked before the model loads).
The policy's weights are kept in fp32 whatever the SFT model is saved in, bf16 coming from
autocast: with vLLM, TRL pushes weights by merging the LoRA adapter into them and unmerging it
every step, which in bf16 does not round back (TRL issue #6688) and would drift the frozen
weights step by step; in fp32 the cycle returns them to within fp32 rounding.
A step's size is the recipe's (grpo.prompts_per_step questions x num_generations), split over
however many processes run it. The adapter is saved atomically; checkpoints and `grpo.resume`
follow sqlrl/train/checkpoints.py (same params, seed, prompts and SFT model, or a fresh start).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import statistics
import time
from collections import Counter
from pathlib import Path

from sqlrl.errors import PipelineError
from sqlrl.formats import get_format
from sqlrl.hardware import resolve_bf16, set_torch_threads
from sqlrl.model.generate import shared_prompt_prefill
from sqlrl.outputs import save_atomically
from sqlrl.params import GrpoParams
from sqlrl.patches import (
    completion_logits_only_on_cpu,
    constrained_rollouts,
    per_turn_completion_budget,
    timed_rollouts,
    vllm_cpu_keeps_linear_weights,
)
from sqlrl.progress import trainer_progress
from sqlrl.train.checkpoints import (
    dvclive_callback,
    prepare_checkpoints,
    run_fingerprint,
)
from sqlrl.train.rewards import reward_weight_list
from sqlrl.train.vllm_server import require_vllm, wait_for_server

log = logging.getLogger(__name__)


class StepTimer:
    """Seconds spent in generation+scoring and in reward functions, over the run."""

    def __init__(self):
        self.reward_s = 0.0
        self.rollout_s = 0.0

    def add_rollout(self, seconds: float) -> None:
        self.rollout_s += seconds

    def wrap_reward(self, fn):
        """`fn`, adding its wall time to reward_s (name and doc kept: TRL logs by name)."""

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.reward_s += time.perf_counter() - start

        return timed


def use_vllm(params: GrpoParams) -> bool:
    """grpo.use_vllm where vLLM is installed; otherwise transformers rollouts, with a warning
    (TRL would raise an ImportError from deep inside the trainer). Server mode without vLLM
    is an error instead: a server was started for this run and would sit unused."""
    from sqlrl.model.generate import vllm_available

    if params.use_vllm and params.vllm_mode == "server":
        require_vllm(params.vllm_server_host, params.vllm_server_port)
    if params.use_vllm and not vllm_available():
        log.warning(
            "grpo.use_vllm is set but vLLM is not installed (pip install -r "
            "requirements-gpu.txt on a CUDA machine); rolling out with transformers"
        )
        return False
    return params.use_vllm


def grpo_config(params: GrpoParams, seed: int, output_dir: str, world_size: int = 1):
    """TRL's GRPOConfig from params. Every setting that shapes the rollouts or the run is set
    from params, none left to TRL's defaults: sampling, the vLLM engine's memory, context, sleep
    and parallelism, bf16 and gradient checkpointing. One generation round per optimizer step,
    of grpo.prompts_per_step x num_generations completions split over world_size processes."""
    from trl import GRPOConfig

    batch, accumulation = params.per_process(world_size)
    vllm = use_vllm(params)
    return GRPOConfig(
        output_dir=output_dir,
        max_steps=params.steps,
        seed=seed,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        num_generations=params.num_generations,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p or None,  # TRL's "off" is None (0.0 would add a no-op filter)
        repetition_penalty=params.repetition_penalty,
        max_completion_length=params.max_completion_length,
        loss_type=params.loss_type,
        beta=params.beta,
        epsilon=params.epsilon,
        epsilon_high=params.epsilon_high,
        scale_rewards=params.scale_rewards,
        num_iterations=params.num_iterations,
        reward_weights=reward_weight_list(params),
        use_vllm=vllm,
        # With vLLM, TRL computes the policy's log-probs of each rollout in a separate pass and
        # weighs the loss by exp(policy - vLLM) (its importance-sampling correction). LoRA
        # dropout in that pass makes the weights noise: off (docs/rollouts.md has the measure).
        disable_dropout=vllm,
        vllm_mode=params.vllm_mode,
        vllm_server_host=params.vllm_server_host,
        vllm_server_port=params.vllm_server_port,
        vllm_server_timeout=params.vllm_server_timeout_s,
        vllm_gpu_memory_utilization=params.vllm_gpu_memory_utilization,
        vllm_max_model_length=params.vllm_max_model_length,
        vllm_enable_sleep_mode=params.vllm_enable_sleep_mode,
        vllm_tensor_parallel_size=params.vllm_tensor_parallel_size,
        bf16=resolve_bf16(params.bf16)[0],
        gradient_checkpointing=params.gradient_checkpointing,
        logging_steps=params.logging_steps,
        save_steps=params.save_steps,
        save_total_limit=2,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        use_cpu=not _cuda(),
        dataloader_num_workers=0,
        **rollout_settings(params),
    )


def rollout_settings(params: GrpoParams) -> dict:
    """GRPOConfig settings only the rollout's format sets (none for `sql`: the default run's
    config is what it was before formats existed; the agent's: TRL's tool turns)."""
    return get_format(params.rollout).trainer_settings(params)


def check_vllm_server(params: GrpoParams) -> int | None:
    """Server mode: vLLM installed here and the server up, before minutes go into loading the
    model (TRL would only find out in the trainer's constructor). Its world size, or None when
    rollouts do not use a server."""
    if not (params.use_vllm and params.vllm_mode == "server"):
        return None
    if not _cuda():
        raise PipelineError(
            "grpo.vllm_mode server needs a CUDA device: TRL 1.16 pushes the policy's weights to "
            "the vLLM server over NCCL (\"Weight synchronization runs on vLLM's NCCL "
            'weight-transfer engine, which needs a CUDA device"); on a CPU use '
            "grpo.vllm_mode colocate (vLLM's CPU build) or grpo.use_vllm false"
        )
    require_vllm(params.vllm_server_host, params.vllm_server_port)
    workers = wait_for_server(
        params.vllm_server_host, params.vllm_server_port, params.vllm_server_timeout_s
    )
    log.info(
        "vLLM server at %s:%s is up (%s worker(s))",
        params.vllm_server_host,
        params.vllm_server_port,
        workers,
    )
    return workers


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


POLICY_DTYPE = "float32"  # the trained policy's weights; bf16 is autocast (module docstring)


def load_policy(sft_dir: str | Path):
    """(model, tokenizer): the SFT model as GRPO trains it, its weights in POLICY_DTYPE."""
    from sqlrl.model.attention import grouped_query_attention
    from sqlrl.model.modeling import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(sft_dir, dtype=POLICY_DTYPE)
    return grouped_query_attention(model), tokenizer  # rollouts without a KV-cache copy


def grpo_fingerprint(params: GrpoParams, seed: int, sft_dir: str | Path, rows: list[dict]) -> str:
    """What a GRPO run computes from: params, seed, its prompt rows and the SFT model's files."""
    return run_fingerprint(params, seed, [sft_dir], extra=rows)


def reseed_after_vllm_engine(trainer, seed: int) -> bool:
    """Seed the global generators again once the trainer has built a colocated vLLM engine
    (TRL's `vllm_generation`, mode "colocate"): vLLM's worker seeds random, numpy and torch
    with the engine's own seed (0 on the first GPU) while it starts, and rollout sampling and
    LoRA dropout would then follow that seed whatever grpo's seed says. Seeded as TRL seeds
    each process just before it builds the engine. True when it re-seeded."""
    from accelerate.utils import set_seed

    engine = getattr(trainer, "vllm_generation", None)
    if getattr(engine, "mode", None) != "colocate":
        return False
    set_seed(seed, device_specific=True)
    return True


def summarize_log(history: list[dict], timer: StepTimer, steps: int, wall_s: float) -> dict:
    """metrics/grpo.json from the trainer's log history."""
    logged = [h for h in history if "reward" in h]
    rewards = [h["reward"] for h in logged]
    window = max(1, len(rewards) // 10)

    def mean_of(key, rows=logged):
        values = [h[key] for h in rows if key in h]
        return round(statistics.fmean(values), 4) if values else None

    losses = [h["loss"] for h in logged if "loss" in h]
    return {
        **importance_sampling_summary(logged),
        "steps": steps,
        "logged_steps": len(logged),
        "first_mean_reward": round(statistics.fmean(rewards[:window]), 4) if rewards else None,
        "final_mean_reward": round(statistics.fmean(rewards[-window:]), 4) if rewards else None,
        "peak_reward": round(max(rewards), 4) if rewards else None,
        "final_loss": round(losses[-1], 6) if losses else None,
        "mean_frac_reward_zero_std": mean_of("frac_reward_zero_std"),
        "mean_completion_length": mean_of("completions/mean_length"),
        "mean_kl": mean_of("kl"),
        "wall_seconds": round(wall_s, 1),
        "seconds_per_step": {
            "total": round(wall_s / max(steps, 1), 3),
            "generation": round((timer.rollout_s - timer.reward_s) / max(steps, 1), 3),
            "reward": round(timer.reward_s / max(steps, 1), 3),
            "update": round((wall_s - timer.rollout_s) / max(steps, 1), 3),
        },
    }


IS_KEY = "sampling/importance_sampling_ratio/"
LOGP_KEY = "sampling/sampling_logp_difference/"


def importance_sampling_summary(logged: list[dict]) -> dict:
    """TRL's importance-sampling statistics over the run, where rollouts came from vLLM (TRL
    logs them only then; nothing otherwise): how far vLLM's log-probs of its own samples were
    from the policy's (|difference| per token, mean and max) and the ratio exp(policy - vLLM)
    TRL weighs the loss with (its min, mean and max). Near 0 and 1 when the weight sync works;
    a stale or drifting engine shows here first."""
    if not any(IS_KEY + "mean" in h for h in logged):
        return {}

    def values(key):
        return [h[key] for h in logged if key in h and h[key] == h[key]]  # NaN: nothing logged

    def rounded(fn, key):
        found = values(key)
        return round(fn(found), 6) if found else None

    return {
        "importance_sampling": {
            "ratio_min": rounded(min, IS_KEY + "min"),
            "ratio_mean": rounded(statistics.fmean, IS_KEY + "mean"),
            "ratio_max": rounded(max, IS_KEY + "max"),
            "logp_difference_mean": rounded(statistics.fmean, LOGP_KEY + "mean"),
            "logp_difference_max": rounded(max, LOGP_KEY + "max"),
        }
    }


def train_grpo(
    params: GrpoParams,
    seed: int,
    sft_dir: str | Path,
    rows: list[dict],
    out_dir: str | Path,
    reward_funcs: list,
    checkpoint_dir: str | Path,
    dvclive_dir: str | Path | None,
    torch_threads: int = 0,
    spider_dir: str | Path | None = None,
) -> dict:
    """Train the LoRA adapter on `rows` (prompt, gold_sql, db_path, ...) and save it to out_dir.
    Every column reaches the reward functions (TRL passes them as keyword arguments).
    checkpoint_dir should be outside DVC's outputs, so an interrupted run can resume from it
    (grpo.resume); the curves go to dvclive_dir (None: nowhere). grpo.constrained reads the
    rows' schemas from spider_dir/tables.json (sqlrl/train/constrained.py)."""
    from datasets import Dataset
    from transformers import set_seed
    from trl import GRPOTrainer

    from sqlrl.model.modeling import lora_config
    from sqlrl.train.launch import is_main_process, wait_for_everyone, world_size

    check_vllm_server(params)
    if params.constrained and spider_dir is None:
        raise PipelineError("grpo.constrained reads the rows' schemas: pass spider_dir")
    writer = is_main_process()  # the one process that deletes, writes and renames outputs
    threads = set_torch_threads(torch_threads)
    set_seed(seed)
    timer = StepTimer()
    model, tokenizer = load_policy(sft_dir)
    answer_format = get_format(params.rollout)
    dataset = Dataset.from_list(answer_format.rows(rows))  # the format's system prompt
    fingerprint = grpo_fingerprint(params, seed, sft_dir, rows)
    resume_from = prepare_checkpoints(checkpoint_dir, fingerprint, params.resume, writer)
    wait_for_everyone()
    live, callbacks = None, [trainer_progress("grpo")]
    if dvclive_dir and writer:  # optional: the GPU rehearsal runs where dvclive is not installed
        live, callback = dvclive_callback(dvclive_dir, resume_from)
        callbacks.append(callback)
    args = grpo_config(params, seed, str(checkpoint_dir), world_size())
    factory, episodes = answer_format.environment(params)  # the agent's tool, else None
    agent = {"environment_factory": factory} if factory is not None else {}
    with vllm_cpu_keeps_linear_weights():  # the colocated engine is built here; a no-op on GPUs
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[timer.wrap_reward(f) for f in reward_funcs],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(params.lora),
            callbacks=callbacks,
            **agent,
        )
    reseed_after_vllm_engine(trainer, seed)
    grammars = None
    if params.constrained:
        from sqlrl.train.constrained import rollout_grammars

        compose = answer_format.answer_grammar  # params refuse a format without one
        grammars = rollout_grammars(trainer, tokenizer, spider_dir, compose)
    # sqlrl/patches.py says what each does and why; shared_prompt_prefill: sqlrl.model.generate
    with contextlib.ExitStack() as patched:
        patched.enter_context(timed_rollouts(trainer, timer.add_rollout))
        patched.enter_context(completion_logits_only_on_cpu())
        if not args.use_vllm:
            patched.enter_context(shared_prompt_prefill(trainer.model))
        if grammars is not None:  # after the prefill: its generate gets the processor
            patched.enter_context(constrained_rollouts(trainer, grammars))
        if answer_format.calls_tools:
            patched.enter_context(per_turn_completion_budget(trainer))
        start = time.perf_counter()
        trainer.train(resume_from_checkpoint=resume_from)
        wall = time.perf_counter() - start

    def save(folder: Path) -> None:
        trainer.save_model(str(folder))  # every process takes part (sharded models)
        if writer:
            tokenizer.save_pretrained(folder)
            sort_adapter_config(folder)

    save_atomically(out_dir, save, writer, wait_for_everyone)
    if live is not None:
        live.end()
    metrics = {
        **summarize_log(trainer.state.log_history, timer, trainer.state.global_step, wall),
        **_run_settings(trainer, params),
        "resumed_from": Path(resume_from).name if resume_from else None,
        "torch_threads": threads,
        **rollout_metrics(params, trainer.state.log_history, episodes, reward_funcs),
    }
    if grammars is not None:  # absent when off: the default run's metrics are what they were
        metrics["constrained"] = grammars.summary()
    log.info(
        "reward %s -> %s over %s steps",
        metrics["first_mean_reward"],
        metrics["final_mean_reward"],
        metrics["steps"],
    )
    return metrics


def rollout_metrics(params: GrpoParams, history: list[dict], episodes, reward_funcs) -> dict:
    """The rollout format's own metrics (none for `sql`, whose Format reports none): the
    format reward's mean where it is weighted in; for the agent, tool calls per episode, the
    share of calls that failed (SQL errors, time-outs, refusals, calls past max_turns) and the
    share of episodes that ended without a final answer (as execution_reward found them)."""
    if not get_format(params.rollout).reports:
        return {}
    out: dict = {"rollout": params.rollout}
    key = "rewards/format_reward/mean"
    formats = [h[key] for h in history if key in h]
    if formats:
        out["mean_format_reward"] = round(statistics.fmean(formats), 4)
    if episodes is not None:
        out["tool_calls_per_episode"] = round(episodes.calls / max(episodes.episodes, 1), 4)
        out["failed_tool_call_share"] = round(episodes.failed_calls / max(episodes.calls, 1), 4)
        out["episodes"] = episodes.episodes
    judged = [f.stats for f in reward_funcs if isinstance(getattr(f, "stats", None), Counter)]
    if judged and (total := sum(v for k, v in judged[0].items() if k != "without_sql")):
        out["no_answer_share"] = round(judged[0]["without_sql"] / total, 4)
    return out


def sort_adapter_config(folder: Path) -> None:
    """PEFT writes target_modules from a Python set, in an order that changes with each
    process's string hashing: sorted, the same run saves the same bytes (and DVC the same
    hash)."""
    path = Path(folder) / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _run_settings(trainer, params: GrpoParams) -> dict:
    """How the run was set up, as the trainer resolved it (processes, step size, dtype)."""
    args = trainer.args
    return {
        "world_size": trainer.accelerator.num_processes,
        "prompts_per_step": args.generation_batch_size // params.num_generations,
        "completions_per_step": args.generation_batch_size,
        "use_vllm": bool(args.use_vllm),
        "bf16": bool(args.bf16),
        "bf16_reason": resolve_bf16(params.bf16)[1],
    }
