"""GRPO with the execution reward: TRL's GRPOTrainer on the SFT model with a LoRA adapter.

The prompts come from the grpo_prompts stage (sqlrl/train/grpo_prompts.py).
Rollouts use transformers generation, or vLLM where installed and asked for: colocated on the
training GPUs, or a separate server (grpo.vllm_mode: server, checked before the model loads).
The adapter is written to a temporary folder and renamed at the end, so an interrupted run
never leaves an output that looks complete; checkpoints live outside the DVC output so that
`grpo.resume: true` can continue an interrupted run: only a run of the same params, seed,
prompts and SFT model (a fingerprint is kept with the checkpoints); otherwise it starts fresh.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import statistics
import time
from pathlib import Path

from sqlrl.hardware import resolve_bf16, set_torch_threads
from sqlrl.params import GrpoParams
from sqlrl.progress import trainer_progress
from sqlrl.train.vllm_server import require_vllm, wait_for_server

log = logging.getLogger(__name__)

ROW_KEYS = ("prompt", "gold_sql", "db_id", "question", "db_path")  # a GRPO row: prepare writes them


def reward_functions(params: GrpoParams, spider_dir: str | Path) -> list:
    """[execution, syntax] rewards as the profile configures them; the same in prompt selection
    and in training, so a prompt's pass rate is measured by the reward it is trained on.
    Schema repair reads the schemas from spider_dir/tables.json."""
    from sqlrl.data.spider import load_schemas
    from sqlrl.sql.executor import ExecLimits
    from sqlrl.train.rewards import make_rewards

    schemas = load_schemas(Path(spider_dir) / "tables.json") if params.schema_repair else None
    return list(
        make_rewards(
            ExecLimits(timeout_s=params.reward_timeout_s),
            schemas=schemas,
            executable_credit=params.executable_credit,
        )
    )


class StepTimer:
    """Seconds spent in generation+scoring and in reward functions, per optimizer step."""

    def __init__(self):
        self.reward_s = 0.0
        self.rollout_s = 0.0

    def wrap_reward(self, fn):
        return self._timed(fn, "reward_s")

    def wrap_rollout(self, fn):
        return self._timed(fn, "rollout_s")

    def _timed(self, fn, counter: str):
        """`fn`, adding its wall time to self.<counter> (name and doc kept: TRL logs by name)."""

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, counter, getattr(self, counter) + time.perf_counter() - start)

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


def grpo_config(params: GrpoParams, seed: int, output_dir: str):
    """TRL's GRPOConfig from params; bf16 and gradient checkpointing always explicit. One
    generation round per optimizer step: batch_size * grad_accum completions per device."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        max_steps=params.steps,
        seed=seed,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=params.batch_size,
        gradient_accumulation_steps=params.grad_accum,
        num_generations=params.num_generations,
        temperature=params.temperature,
        max_completion_length=params.max_completion_length,
        loss_type=params.loss_type,
        beta=params.beta,
        epsilon=params.epsilon,
        epsilon_high=params.epsilon_high,
        scale_rewards=params.scale_rewards,
        num_iterations=params.num_iterations,
        reward_weights=[params.reward_weights.execution, params.reward_weights.syntax],
        use_vllm=use_vllm(params),
        vllm_mode=params.vllm_mode,
        vllm_server_host=params.vllm_server_host,
        vllm_server_port=params.vllm_server_port,
        vllm_server_timeout=params.vllm_server_timeout_s,
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
    )


def check_vllm_server(params: GrpoParams) -> int | None:
    """Server mode: vLLM installed here and the server up, before minutes go into loading the
    model (TRL would only find out in the trainer's constructor). Its world size, or None when
    rollouts do not use a server."""
    if not (params.use_vllm and params.vllm_mode == "server"):
        return None
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


def score_completions_only_on_cpu() -> bool:
    """TRL 1.16's fused LM head scores only the completion tokens on a Triton device, but every
    position (prompt included) elsewhere, to keep tile shapes fixed for compiled backends. A CPU
    runs eagerly, so score only the completions there too: the same log-probabilities, and the
    vocabulary-sized head runs on ~100 completion tokens instead of ~400 prompt + completion
    (on Qwen's 152k vocabulary that head dominates a CPU step). False when TRL has no such hook."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:
        return False
    if not getattr(original, "completions_only_on_cpu", False):

        def compact(device) -> bool:
            return device.type == "cpu" or original(device)

        compact.completions_only_on_cpu = True
        trl_utils._use_triton = compact
    return True


def share_prompt_prefill(model) -> None:
    """TRL's transformers rollouts hold each prompt num_generations times in a row: have the
    model run each prompt once and copy its KV cache to the repeats (sqlrl.model.generate.
    shared_prefix_generate): the same samples, ~1/num_generations of the prompt compute."""
    from sqlrl.model.generate import shared_prefix_generate

    own_generate = model.generate

    def generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        if input_ids is None or attention_mask is None:
            return own_generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=generation_config,
                **kwargs,
            )
        return shared_prefix_generate(
            model, input_ids, attention_mask, generation_config, generate=own_generate, **kwargs
        )

    model.generate = generate


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


FINGERPRINT_FILE = "sqlrl_run.json"
# they do not change the result: resuming, checkpoint and log intervals, the vLLM server's address
_NOT_FINGERPRINTED = (
    "resume",
    "save_steps",
    "logging_steps",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout_s",
)


def run_fingerprint(params: GrpoParams, seed: int, sft_dir: str | Path, rows: list[dict]) -> str:
    """A hash of what a GRPO run computes from: its params (not resume, save or logging
    settings, nor where the vLLM server listens), seed, prompts and the SFT model's files."""
    settings = {k: v for k, v in dataclasses.asdict(params).items() if k not in _NOT_FINGERPRINTED}
    digest = hashlib.sha256(
        json.dumps(
            {"grpo": settings, "seed": seed, "rows": rows}, sort_keys=True, default=str
        ).encode()
    )
    for path in sorted(p for p in Path(sft_dir).rglob("*") if p.is_file()):
        digest.update(path.relative_to(sft_dir).as_posix().encode())
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def checkpoint_to_resume(checkpoint_dir: str | Path, fingerprint: str) -> str | None:
    """The last checkpoint in checkpoint_dir when it was made by a run with this fingerprint;
    None (and a line saying why) when there is none or it belongs to another run."""
    last = last_checkpoint(checkpoint_dir)
    if last is None:
        return None
    stored = Path(checkpoint_dir) / FINGERPRINT_FILE
    made_by = json.loads(stored.read_text())["fingerprint"] if stored.is_file() else None
    if made_by != fingerprint:
        log.warning(
            "not resuming from %s: it was made with other grpo params, seed, prompts or SFT "
            "model; starting fresh",
            last,
        )
        return None
    return last


def last_checkpoint(checkpoint_dir: str | Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    path = Path(checkpoint_dir)
    return get_last_checkpoint(str(path)) if path.is_dir() else None


def curves_at_checkpoint(dvclive_dir: str | Path, checkpoint: str | Path) -> int:
    """Cut the DVCLive curves back to the points logged up to `checkpoint` and return how
    many that is: the trainer redoes the steps after it, and their points come again.
    (DVCLiveCallback makes one point per trainer log, and the checkpoint keeps the logs.)"""
    import csv

    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    kept = len(state.get("log_history", []))
    for tsv in Path(dvclive_dir, "plots", "metrics").rglob("*.tsv"):
        with open(tsv, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if not rows:
            continue
        with open(tsv, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, list(rows[0]), delimiter="\t", lineterminator=os.linesep)
            writer.writeheader()
            writer.writerows(r for r in rows if int(r["step"]) < kept)
    return kept


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
) -> dict:
    """Train the LoRA adapter on `rows` (prompt, gold_sql, db_path, ...) and save it to out_dir.
    Every column reaches the reward functions (TRL passes them as keyword arguments).
    checkpoint_dir should be outside DVC's outputs, so an interrupted run can resume from it
    (grpo.resume); the curves go to dvclive_dir (None: nowhere)."""
    from datasets import Dataset
    from transformers import set_seed
    from trl import GRPOTrainer

    from sqlrl.model.modeling import load_model_and_tokenizer, lora_config
    from sqlrl.train.launch import is_main_process, wait_for_everyone

    check_vllm_server(params)
    writer = is_main_process()  # the one process that deletes, writes and renames outputs
    threads = set_torch_threads(torch_threads)
    set_seed(seed)
    timer = StepTimer()
    model, tokenizer = load_model_and_tokenizer(sft_dir)
    dataset = Dataset.from_list(rows)
    fingerprint = run_fingerprint(params, seed, sft_dir, rows)
    resume_from = checkpoint_to_resume(checkpoint_dir, fingerprint) if params.resume else None
    if writer:
        if resume_from is None:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
        fingerprint_file = Path(checkpoint_dir) / FINGERPRINT_FILE
        fingerprint_file.write_text(json.dumps({"fingerprint": fingerprint}))
    wait_for_everyone()
    live, callbacks = None, [trainer_progress("grpo")]
    if dvclive_dir and writer:  # optional: the GPU rehearsal runs where dvclive is not installed
        from transformers.integrations import DVCLiveCallback

        from dvclive import Live

        live = Live(str(dvclive_dir), dvcyaml=False, save_dvc_exp=False, resume=bool(resume_from))
        if resume_from:  # DVCLive would go on from its own last point, not the checkpoint's
            live.step = curves_at_checkpoint(dvclive_dir, resume_from)
        callbacks.append(DVCLiveCallback(live=live))
    args = grpo_config(params, seed, str(checkpoint_dir))
    score_completions_only_on_cpu()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[timer.wrap_reward(f) for f in reward_funcs],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(params.lora),
        callbacks=callbacks,
    )
    if not args.use_vllm:
        share_prompt_prefill(trainer.model)
    if hasattr(trainer, "_generate_and_score_completions"):
        trainer._generate_and_score_completions = timer.wrap_rollout(
            trainer._generate_and_score_completions
        )
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume_from)
    wall = time.perf_counter() - start
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if writer:
        shutil.rmtree(tmp, ignore_errors=True)
    wait_for_everyone()
    trainer.save_model(str(tmp))  # every process takes part (sharded models); rank 0 writes
    if writer:
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    wait_for_everyone()
    if live is not None:
        live.end()
    metrics = summarize_log(trainer.state.log_history, timer, trainer.state.global_step, wall)
    metrics["resumed_from"] = Path(resume_from).name if resume_from else None
    world = trainer.accelerator.num_processes
    metrics.update(
        world_size=world,
        prompts_per_step=params.prompts_per_step(world),
        completions_per_step=params.batch_size * params.grad_accum * world,
        use_vllm=bool(args.use_vllm),
        torch_threads=threads,
        bf16=bool(args.bf16),
        bf16_reason=resolve_bf16(params.bf16)[1],
    )
    log.info(
        "reward %s -> %s over %s steps",
        metrics["first_mean_reward"],
        metrics["final_mean_reward"],
        metrics["steps"],
    )
    return metrics
