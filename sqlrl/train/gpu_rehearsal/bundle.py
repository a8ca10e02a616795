"""The `bundle` command, on a CPU in the repo's own environment: composes the reference profiles
(the GPU side needs no Hydra), prepares Spider as the prepare stage does, keeps the rows
(rows.py), writes versions.json (versions.py) and, with --wheels, the install plan (plan.py),
then the manifest and plan.json, and prints the calls."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlrl.jsonio import read_jsonl, write_json, write_jsonl
from sqlrl.train.gpu_rehearsal.common import (
    PROFILE,
    REPO,
    SFT_KEYS,
    VERSIONS_FILE,
    VLLM_PHASES,
    folder_mib,
    log,
    quantiles,
)
from sqlrl.train.gpu_rehearsal.plan import (
    HEADROOM_MIB,
    WHEEL_PLATFORMS,
    choose_calls,
    image_closure,
    plan_commands,
    print_plan,
    tree_mib,
    write_calls,
)
from sqlrl.train.gpu_rehearsal.rows import (
    copy_databases,
    grpo_selection,
    longest,
    random_rows,
    token_lengths,
)
from sqlrl.train.gpu_rehearsal.versions import (
    PROVIDED,
    RUN_DISTRIBUTIONS,
    check_pins_installed,
    dependency_closure,
    expected_versions,
    marker_environment,
    requirement_pins,
)


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
