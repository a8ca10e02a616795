"""Benchmark the HTTP service: requests/s and latency percentiles under concurrent load.

    .venv/bin/python benchmarks/bench_serve.py [--model models/final] [--requests 64]
        [--concurrency 32] [--execute] [--max-new-tokens N] [--default-profile-model]

Starts `python -m sqlrl.serve` as a subprocess on 127.0.0.1 (a free port), waits for
/health, sends one warm-up request, then `--requests` POST /generate calls (db_id form, the
questions of data/prepared/dev.jsonl whose database is present) with at most `--concurrency`
in flight, and prints requests/s, p50/p95/max latency and the server's batching counters as one
JSON object. The model defaults to models/final, else models/sft.

`--default-profile-model` serves a model with the default (cpu) profile's architecture instead:
built like the base stage (tokenizer trained on data/prepared/sft.jsonl, seeded random weights)
in a temporary folder. Random weights rarely emit an end token, so every answer runs to
max_new_tokens: a worst case for latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_model(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    for candidate in ("models/final", "models/sft"):
        if (ROOT / candidate / "config.json").is_file():
            return ROOT / candidate
    raise SystemExit("bench_serve: neither models/final nor models/sft exists; pass --model")


def default_profile_model(out: Path) -> Path:
    from sqlrl.data.prompt_settings import write_prompt_settings
    from sqlrl.model.modeling import build_scratch
    from sqlrl.params import compose_params, params_from_dict

    params = params_from_dict(compose_params("cpu"))
    build_scratch(params.base, params.seed, ROOT / "data/prepared/sft.jsonl", out)
    # the server builds prompts from the model folder's settings, as sft saves them
    write_prompt_settings(out, params.prepare, params.eval.schema_repair)
    return out


def questions(n: int) -> list[dict]:
    rows = []
    with open(ROOT / "data/prepared/dev.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("db_present"):
                rows.append({"question": row["question"], "db_id": row["db_id"]})
    if not rows:
        raise SystemExit("bench_serve: data/prepared/dev.jsonl has no usable rows")
    return [rows[i % len(rows)] for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def load(base: str, bodies: list[dict], concurrency: int, timeout: float):
    import httpx

    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    statuses: list[int] = []

    async with httpx.AsyncClient(base_url=base, timeout=timeout) as http:

        async def one(body):
            async with sem:
                t0 = time.perf_counter()
                r = await http.post("/generate", json=body)
                latencies.append(time.perf_counter() - t0)
                statuses.append(r.status_code)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - t0
        health = (await http.get("/health")).json()
    return latencies, statuses, wall, health


def main() -> int:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--default-profile-model", action="store_true")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--execute", action="store_true")
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="bench_serve_")
    if args.default_profile_model:
        t0 = time.perf_counter()
        model = default_profile_model(Path(tmp.name) / "model")
        print(f"built a default-profile model in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    else:
        model = pick_model(args.model)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "sqlrl.serve",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--backend",
        args.backend,
        "--log-level",
        "warning",
        "--max-batch-size",
        str(args.max_batch_size),
        "--request-timeout-s",
        str(args.timeout),
        "--torch-threads",
        str(args.torch_threads),
    ]
    if args.max_new_tokens:
        cmd += ["--max-new-tokens", str(args.max_new_tokens)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(cmd, cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise SystemExit(f"bench_serve: the server exited with {server.returncode}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("bench_serve: the server did not come up in 300 s")
            time.sleep(0.5)
        bodies = questions(args.requests + 1)
        for b in bodies:
            b["execute"] = args.execute
        httpx.post(base + "/generate", json=bodies[0], timeout=args.timeout)  # warm-up
        latencies, statuses, wall, health = asyncio.run(
            load(base, bodies[1:], args.concurrency, args.timeout)
        )
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        tmp.cleanup()
    ok = sum(1 for s in statuses if s == 200)
    result = {
        "model": str(model),
        "backend": health.get("backend"),
        "default_profile_model": args.default_profile_model,
        "requests": len(statuses),
        "ok": ok,
        "concurrency": args.concurrency,
        "execute": args.execute,
        "max_new_tokens": args.max_new_tokens or "server default",
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(statuses) / wall, 3),
        "latency_p50_s": round(statistics.median(latencies), 3),
        "latency_p95_s": round(percentile(latencies, 0.95), 3),
        "latency_max_s": round(max(latencies), 3),
        "batching": health.get("batching"),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return 0 if ok == len(statuses) else 1


if __name__ == "__main__":
    raise SystemExit(main())
