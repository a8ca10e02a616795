"""What every side of the GPU rehearsal shares: the repo and the entry point's paths, the
profiles it rehearses, the names of the files the sides hand each other, the log line, file
sizes and hashes. Standard library only, like every module here that the GPU machine imports
before `install` has run (see the package's docstring)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
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


def log(message: str, _start=time.time()) -> None:  # noqa: B008 (the import time, once)
    """A timestamped line (wall clock and seconds since start), flushed: the GPU machine may
    return only the tail of the output, and a cut-off run should still show where it was."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - _start:7.1f}s] {message}", flush=True)


def folder_mib(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 2)


def quantiles(values: list[int]) -> dict:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "min": ordered[0],
        "p50": ordered[len(ordered) // 2],
        "mean": round(statistics.fmean(ordered), 1),
        "max": ordered[-1],
    }


def sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
