"""gpu_rehearsal.json: the report the run rewrites after every change (a run cut off still
returns what it measured), JSON-safe numbers, and the split of one GRPO step into its parts
taken from the phases that measured them."""

from __future__ import annotations

import math
import traceback
from pathlib import Path

from sqlrl.jsonio import write_json
from sqlrl.train.gpu_rehearsal.common import log


def json_safe(value):
    """NaN and infinities as text (JSON has none, and write_json refuses them): a diverged loss
    must not cost the report."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


class Report:
    """DIR/gpu_rehearsal.json, rewritten after every change: a run cut off by the machine's
    time limit still returns everything measured so far."""

    def __init__(self, path: Path, **fields):
        self.path = path
        self.data = {"errors": {}, "skipped": {}, "unavailable": {}, **fields}
        self.save()

    def set(self, key: str, value) -> None:
        self.data[key] = value
        self.save()

    def skip(self, phase: str, reason: str) -> None:
        self.data["skipped"][phase] = reason
        self.save()
        log(f"{phase}: skipped: {reason}")

    def unavailable(self, phase: str, reason: str) -> None:
        """A phase this machine cannot run (vLLM not installed): said, and not counted as
        incomplete, since no budget or retry would run it here."""
        self.data["unavailable"][phase] = reason
        self.save()
        log(f"{phase}: not run: {reason}")

    def fail(self, phase: str, exc: BaseException) -> None:
        self.error(phase, "".join(traceback.format_exception(exc))[-4000:])

    def error(self, phase: str, text: str) -> None:
        self.data["errors"][phase] = text
        self.save()
        log(f"{phase} FAILED: {text.strip().splitlines()[-1] if text.strip() else text}")

    def save(self) -> None:
        write_json(self.path, json_safe(self.data))


def step_split(report: dict) -> dict:
    """Seconds per GRPO step, part by part. Generation and sync as the reference runs them
    where the vllm_sql phase measured them (its colocated engine), else generation (and
    reward) from the trainer phase, which rolls out with transformers (an upper bound), and the
    sync from the parts phase; log-prob and update from the parts phase, under the training
    side's memory cap."""
    trainer = report.get("grpo", {}).get("seconds_per_step", {})
    parts = report.get("grpo_parts", {}).get("seconds_per_step", {})
    vllm = report.get("vllm_sql", {})
    vllm_generation = vllm.get("generation", {}).get("seconds_per_step")
    vllm_sync = vllm.get("sync", {}).get("seconds_per_sync")
    vllm_reward = (vllm.get("trainer") or {}).get("seconds_per_step", {}).get("reward")
    split = {
        "generation": vllm_generation if vllm_generation else trainer.get("generation"),
        "reward": vllm_reward if vllm_generation else trainer.get("reward"),
        "sync": vllm_sync if vllm_sync else parts.get("sync"),
        "logprob": parts.get("logprob"),
        "update": parts.get("update"),
        "trainer_update": trainer.get("update"),
        "generation_from": "vllm_sql" if vllm_generation else "grpo (transformers)",
        "sync_from": "vllm_sql" if vllm_sync else "grpo_parts",
    }
    known = [split[k] for k in ("generation", "reward", "sync", "logprob", "update")]
    split["total"] = round(sum(known), 3) if all(v is not None for v in known) else None
    split["note"] = (
        "generation and sync: the colocated vLLM engine's where vllm_sql ran, else transformers "
        "rollouts (an upper bound for vLLM's) and the parts phase's sync; logprob, update: the "
        "reference step's other parts on the policy GRPO trains; trainer_update: the "
        "transformers-rollout trainer's whole update, for comparison"
    )
    return split
