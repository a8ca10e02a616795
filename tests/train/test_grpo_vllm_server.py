"""GRPO rollouts from a vLLM server (grpo.vllm_mode: server): the settings reach TRL's
GRPOConfig, and a missing server fails early and clearly. The stand-in server answers the
endpoints TRL 1.16's VLLMClient asks before training (trl/generation/vllm_client.py):
GET /health (check_server) and GET /get_world_size (init_communicator)."""

from __future__ import annotations

import dataclasses
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sqlrl.errors import PipelineError
from sqlrl.params import ParamsError, compose_params, params_from_dict
from sqlrl.train.grpo import check_vllm_server, grpo_config
from sqlrl.train.grpo import grpo_fingerprint as run_fingerprint
from sqlrl.train.vllm_server import VllmServerError, wait_for_server
from stages import run_stage
from tests.repo_tools import REPO_ROOT

SERVER_MODE = ["grpo.use_vllm=true", "grpo.vllm_mode=server"]


def _grpo(*overrides: str, profile: str = "smoke"):
    conf = REPO_ROOT / "conf"  # some tests run in a temporary folder
    return params_from_dict(compose_params(profile, list(overrides), conf)).grpo


@pytest.fixture
def a_gpu(monkeypatch):
    """The trainer on a CUDA machine, as server mode needs (its weight sync is NCCL's)."""
    import sqlrl.train.grpo

    monkeypatch.setattr(sqlrl.train.grpo, "_cuda", lambda: True)


@pytest.fixture
def vllm_installed(monkeypatch):
    """vllm_available() true without vLLM: GRPOConfig itself never imports it."""
    import sqlrl.model.generate

    monkeypatch.setattr(sqlrl.model.generate, "vllm_available", lambda: True)


class StandIn(ThreadingHTTPServer):
    """vLLM's server as TRL sees it: /health is 200 once loaded (503 for the first
    `loading` requests here), /get_world_size is {"world_size": N} (a dev-mode endpoint:
    404 when `dev_mode` is off). Records every path asked for."""

    def __init__(self, world_size=2, loading=0, dev_mode=True):
        self.world_size, self.loading, self.dev_mode = world_size, loading, dev_mode
        self.requested: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        server = self.server
        server.requested.append(self.path)
        if self.path == "/health":
            loading = server.requested.count("/health") <= server.loading
            self._answer(503 if loading else 200, b"")
        elif self.path == "/get_world_size" and server.dev_mode:
            self._answer(200, json.dumps({"world_size": server.world_size}).encode())
        else:
            self._answer(404, b'{"detail":"Not Found"}')

    def _answer(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def serve():
    servers = []

    def start(**kwargs) -> StandIn:
        server = StandIn(**kwargs)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_server_settings_reach_trls_own_field_names(tmp_path, vllm_installed):
    params = _grpo(
        *SERVER_MODE,
        "grpo.vllm_server_host=10.0.0.7",
        "grpo.vllm_server_port=8123",
        "grpo.vllm_server_timeout_s=17.5",
    )
    config = grpo_config(params, 0, str(tmp_path))
    assert config.use_vllm is True and config.vllm_mode == "server"
    assert (config.vllm_server_host, config.vllm_server_port) == ("10.0.0.7", 8123)
    assert config.vllm_server_timeout == 17.5
    assert config.vllm_server_base_url is None  # else TRL ignores host and port


def test_every_profile_looks_for_the_server_on_this_machine():
    """A profile must not send rollouts to another host unless a run says so (the port and
    the wait are tuning: validated when params load, not pinned here)."""
    for profile in ("cpu", "smoke", "qwen-rehearsal", "qwen2.5-coder-3b"):
        assert _grpo(profile=profile).vllm_server_host in ("127.0.0.1", "localhost", "::1")


def test_the_check_passes_against_a_server_with_trls_endpoints(
    serve, vllm_installed, a_gpu, caplog
):
    caplog.set_level("INFO", logger="sqlrl")
    server = serve(world_size=2)
    params = _grpo(
        *SERVER_MODE, f"grpo.vllm_server_port={server.port}", "grpo.vllm_server_timeout_s=5"
    )
    assert check_vllm_server(params) == 2
    assert server.requested == ["/health", "/get_world_size"]
    assert f"127.0.0.1:{server.port} is up (2 worker(s))" in caplog.text


def test_the_check_waits_while_the_server_loads_its_model(serve):
    server = serve(loading=2)  # /health is 503 twice, then 200
    assert wait_for_server("127.0.0.1", server.port, timeout_s=10, interval_s=0.05) == 2
    assert server.requested == ["/health"] * 3 + ["/get_world_size"]


def test_a_server_without_the_dev_endpoints_is_named(serve):
    server = serve(dev_mode=False)
    with pytest.raises(VllmServerError, match="VLLM_SERVER_DEV_MODE=1") as err:
        wait_for_server("127.0.0.1", server.port, timeout_s=5)
    assert f"127.0.0.1:{server.port}" in str(err.value)


def test_no_server_fails_at_the_timeout_naming_it_and_how_to_start_it(monkeypatch):
    """It polls until the timeout and then gives up, without waiting longer: the clock is a
    stand-in that moves only when the wait sleeps, so the polls fall at known times."""
    import sqlrl.train.vllm_server as vllm_server

    class Clock:
        now = 0.0

        def monotonic(self):
            return self.now

        def sleep(self, seconds):
            self.now += seconds

    clock, polled = Clock(), []
    healthy = vllm_server._healthy
    monkeypatch.setattr(vllm_server, "time", clock)
    monkeypatch.setattr(vllm_server, "_healthy", lambda *a: polled.append(clock.now) or healthy(*a))
    port = _free_port()
    with pytest.raises(VllmServerError) as err:
        wait_for_server("127.0.0.1", port, timeout_s=7.0, interval_s=2.0)
    assert polled == [0.0, 2.0, 4.0, 6.0, 7.0]  # every 2 s, the last try at the deadline
    assert clock.now == 7.0
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message and "within 7 s" in message
    assert (
        "trl vllm-serve --model <the SFT model" in message and "--tensor-parallel-size" in message
    )
    assert f"--host 127.0.0.1 --port {port}" in message


def test_the_grpo_stage_prints_a_missing_server_as_one_line(
    tmp_path, monkeypatch, capsys, vllm_installed, a_gpu
):
    monkeypatch.chdir(tmp_path)  # the stage lock lives under the working directory
    params = _grpo(
        *SERVER_MODE, f"grpo.vllm_server_port={_free_port()}", "grpo.vllm_server_timeout_s=0"
    )
    assert issubclass(VllmServerError, PipelineError)
    assert run_stage("grpo", check_vllm_server, params) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("grpo: no vLLM server answered at 127.0.0.1:") and "\n" not in err


def test_server_mode_on_a_trainer_without_cuda_is_refused_before_the_model_loads(
    vllm_installed, monkeypatch
):
    """TRL 1.16's VLLMClient.init_communicator refuses a non-CUDA device ("Weight
    synchronization runs on vLLM's NCCL weight-transfer engine, which needs a CUDA device"),
    but only after the model has loaded and the server was reached: say so first."""
    import sqlrl.train.grpo

    monkeypatch.setattr(sqlrl.train.grpo, "_cuda", lambda: False)
    with pytest.raises(PipelineError, match="needs a CUDA device.*vllm_mode colocate"):
        check_vllm_server(_grpo(*SERVER_MODE))


def test_server_mode_without_vllm_on_the_trainer_is_an_error(tmp_path, monkeypatch, a_gpu):
    """TRL's client needs vLLM on the trainer side (weight sync over its NCCL engine): no
    silent fallback to transformers rollouts while a server waits."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails
    params = _grpo(*SERVER_MODE)
    with pytest.raises(VllmServerError, match="vLLM is not installed where the trainer runs"):
        check_vllm_server(params)
    with pytest.raises(VllmServerError, match="trl vllm-serve --model <the SFT model"):
        grpo_config(params, 0, str(tmp_path))


def test_colocate_and_transformers_rollouts_ask_no_server():
    assert check_vllm_server(_grpo("grpo.use_vllm=true")) is None  # colocate
    assert check_vllm_server(_grpo("grpo.vllm_mode=server")) is None  # use_vllm false


@pytest.mark.parametrize(
    "override,message",
    [
        ("grpo.vllm_server_port=70000", "grpo.vllm_server_port: .* less than or equal to 65535"),
        ("grpo.vllm_server_port=0", "grpo.vllm_server_port: .* greater than or equal to 1"),
        ("grpo.vllm_server_port=eight", "grpo.vllm_server_port: Input should be a valid integer"),
        ("grpo.vllm_mode=remote", "grpo.vllm_mode: Input should be 'colocate' or 'server'"),
        ("grpo.vllm_server_host=''", "grpo.vllm_server_host: String should have at least 1"),
        ("grpo.vllm_server_timeout_s=-1", "grpo.vllm_server_timeout_s: .* greater than or equal"),
    ],
)
def test_bad_server_settings_are_params_errors(override, message):
    with pytest.raises(ParamsError, match=message):
        _grpo(override)


def test_the_servers_address_does_not_change_the_run_fingerprint(tmp_path):
    """Moving the server to another port must not throw away the checkpoints to resume."""
    params = _grpo(*SERVER_MODE)
    moved = dataclasses.replace(params, vllm_server_host="10.0.0.7", vllm_server_port=9000)
    colocated = dataclasses.replace(params, vllm_mode="colocate")
    fingerprints = [run_fingerprint(p, 0, tmp_path, []) for p in (params, moved, colocated)]
    assert fingerprints[0] == fingerprints[1] != fingerprints[2]
