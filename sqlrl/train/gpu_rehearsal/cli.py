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
  --tiny: a 2-layer model and small steps on the CPU (what tests/train/test_gpu_rehearsal.py runs,
  with vLLM's CPU build in `pytest -m vllm`).

  check: the version check and imports alone (seconds).

Random weights never emit <|im_end|>: every completion runs to max_completion_length and the
reward is 0. That is expected; the rehearsal measures cost, not learning.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from sqlrl.train.gpu_rehearsal.bundle import make_bundle
from sqlrl.train.gpu_rehearsal.colocate import vllm_phase
from sqlrl.train.gpu_rehearsal.common import REPO, RESULT_FILE
from sqlrl.train.gpu_rehearsal.install import install
from sqlrl.train.gpu_rehearsal.plan import CARRY_LIMIT_MIB, SITE
from sqlrl.train.gpu_rehearsal.run import RunOptions, preflight, run


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
