"""GRPO rollouts from a separate vLLM server (grpo.vllm_mode: server): an early, clear failure.

TRL 1.16's VLLMClient waits for the server only after the policy model is loaded, and then
fails with a bare ConnectionError; this checks the same endpoints first and says how to start
the server. The server is vLLM's own (`trl vllm-serve` runs `VLLM_SERVER_DEV_MODE=1 vllm serve`
with the flags TRL needs): GET /health answers 200 once it is up, and GET /get_world_size gives
its tensor x pipeline x data parallel workers, which the weight sync joins. In vLLM 0.32 that
endpoint lives in vllm/entrypoints/rl/online/api_router.py, mounted only with
VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/launchers/api_server/routers.py): a 404 without it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from sqlrl.errors import PipelineError

HEALTH_PATH = "/health"  # what trl.generation.vllm_client.VLLMClient.check_server polls
WORLD_SIZE_PATH = "/get_world_size"  # VLLMClient.get_world_size: {"world_size": N}
SERVED_MODEL = "<the SFT model: the grpo stage's --model>"  # TRL pushes the weights each step
# direct connections, as NCCL's weight sync needs anyway: an http_proxy must not catch them
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class VllmServerError(PipelineError):
    """Server-mode rollouts cannot start: vLLM is missing here, or the server is not up."""


def start_command(host: str, port: int, model: str = SERVED_MODEL) -> str:
    """The command that starts a server TRL can use, on GPUs the trainer does not use."""
    return (
        f"CUDA_VISIBLE_DEVICES=<free GPUs> trl vllm-serve --model {model} "
        f"--tensor-parallel-size <number of those GPUs> --host {host} --port {port}"
    )


def require_vllm(host: str, port: int) -> None:
    """Server mode needs vLLM in the trainer's environment too: TRL's VLLMClient refuses to
    start without it, and pushes the weights over vLLM's NCCL weight-transfer engine (CUDA).
    Falling back to transformers would silently ignore the server, so this fails instead."""
    from sqlrl.model.generate import vllm_available

    if not vllm_available():
        raise VllmServerError(
            "grpo.vllm_mode is server but vLLM is not installed where the trainer runs: TRL's "
            "client imports it to push the weights to the server over NCCL (a CUDA machine). "
            "pip install -r requirements-gpu.txt here, then start the server on other GPUs: "
            f"{start_command(host, port)}; or set grpo.vllm_mode: colocate, or grpo.use_vllm: false"
        )


def wait_for_server(host: str, port: int, timeout_s: float, interval_s: float = 2.0) -> int:
    """Poll the server's health endpoint until it answers 200 or timeout_s passes (one try at
    least), then return its world size. Raises VllmServerError naming host:port and the
    command that starts the server."""
    base = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout_s
    while not _healthy(base + HEALTH_PATH, max(0.1, min(5.0, deadline - time.monotonic()))):
        left = deadline - time.monotonic()
        if left <= 0:
            raise VllmServerError(
                f"no vLLM server answered at {host}:{port} ({HEALTH_PATH}) within {timeout_s:g} s "
                f"(grpo.vllm_server_timeout_s). Start it on GPUs the trainer does not use: "
                f"{start_command(host, port)}; grpo.vllm_server_host and grpo.vllm_server_port "
                "must name it"
            )
        time.sleep(min(interval_s, left))
    return _world_size(base, host, port)


def _healthy(url: str, timeout_s: float) -> bool:
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return response.status == 200
    except OSError:  # refused, reset, timed out, or an HTTP error status (URLError is an OSError)
        return False


def _world_size(base: str, host: str, port: int) -> int:
    """The server's worker count; a 404 means it runs without the dev endpoints that TRL's
    weight sync uses (plain `vllm serve` without VLLM_SERVER_DEV_MODE=1)."""
    try:
        with _OPENER.open(base + WORLD_SIZE_PATH, timeout=10) as response:
            return int(json.load(response)["world_size"])
    except urllib.error.HTTPError as exc:
        raise VllmServerError(
            f"the vLLM server at {host}:{port} answered {exc.code} to {WORLD_SIZE_PATH}: it runs "
            "without the development endpoints TRL syncs weights through. Restart it with "
            f"{start_command(host, port)} (it sets VLLM_SERVER_DEV_MODE=1 and the weight "
            "transfer flags)"
        ) from None
    except (OSError, ValueError, KeyError) as exc:
        raise VllmServerError(
            f"the vLLM server at {host}:{port} is up but {WORLD_SIZE_PATH} failed ({exc}); is it "
            f"a vLLM server started with {start_command(host, port)}?"
        ) from None
