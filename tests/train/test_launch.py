"""Training processes: one in-process, more (or an accelerate config) under `accelerate
launch`; only rank 0 writes; each rank sizes its threads and SQL workers by its share."""

from __future__ import annotations

import sys

import pytest

from sqlrl.params import LaunchParams
from sqlrl.train.launch import (
    accelerate_command,
    check_one_process_per_gpu,
    is_main_process,
    world_size,
)
from tests.repo_tools import REPO_ROOT

RANK_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


@pytest.fixture
def single(monkeypatch):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _rank(monkeypatch, rank: int, world: int):
    for name, value in (
        ("RANK", rank),
        ("LOCAL_RANK", rank),
        ("WORLD_SIZE", world),
        ("LOCAL_WORLD_SIZE", world),
    ):
        monkeypatch.setenv(name, str(value))


def test_one_process_without_a_config_runs_in_this_process():
    assert accelerate_command(LaunchParams(1, ""), "stages.sft", cuda=False) is None


def test_two_processes_go_through_accelerate_launch_data_parallel(monkeypatch):
    monkeypatch.setattr("sqlrl.hardware.usable_cores", lambda: 8)
    cmd = accelerate_command(LaunchParams(2, ""), "stages.grpo", cuda=False)
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert cmd[-2:] == ["-m", "stages.grpo"]
    assert "--multi_gpu" in cmd and cmd[cmd.index("--num_processes") + 1] == "2"
    assert cmd[cmd.index("--num_cpu_threads_per_process") + 1] == "4"  # the cores, shared
    on_gpu = accelerate_command(LaunchParams(2, ""), "stages.grpo", cuda=True)
    assert "--num_cpu_threads_per_process" not in on_gpu


def test_a_config_file_is_passed_and_its_process_count_overridden():
    cmd = accelerate_command(LaunchParams(1, "conf/config.yaml"), "stages.sft", cuda=True)
    assert cmd[cmd.index("--config_file") + 1] == "conf/config.yaml"
    assert cmd[cmd.index("--num_processes") + 1] == "1" and "--multi_gpu" not in cmd


@pytest.mark.parametrize(
    ("num_processes", "config", "match"),
    [(0, "", "num_processes"), (2, "conf/accelerate/nope.yaml", "no file")],
)
def test_bad_launch_params_are_refused(num_processes, config, match):
    with pytest.raises(ValueError, match=match):  # pydantic's, naming the field
        LaunchParams(num_processes=num_processes, config=config)


def test_rank_zero_alone_writes(single):
    assert is_main_process() and world_size() == 1
    _rank(single, 1, 2)
    assert not is_main_process() and world_size() == 2
    _rank(single, 0, 2)
    assert is_main_process()


def test_threads_and_sql_workers_are_a_share_of_the_cores(single):
    from sqlrl import hardware
    from sqlrl.sql.judge import default_workers

    single.setattr(hardware, "usable_cores", lambda: 8)
    assert hardware.cores_per_process() == 8 and default_workers() == 8
    _rank(single, 0, 2)
    assert hardware.cores_per_process() == 4 and default_workers() == 4
    _rank(single, 1, 16)
    assert hardware.cores_per_process() == 1 and default_workers() == 1


def test_a_launched_rank_runs_without_the_stage_lock_its_launcher_holds(single, tmp_path):
    """The launcher holds the stage's lock; its ranks must not wait for it (nor fail)."""
    from stages import run_stage, stage_lock

    single.chdir(tmp_path)
    held = stage_lock("sft")
    try:
        assert run_stage("sft", lambda: 0) == 1  # a second plain run: refused
        _rank(single, 1, 2)
        assert run_stage("sft", lambda: 7) == 7  # a rank of the launched group: runs
    finally:
        held.close()


STAGE_FLAGS = {
    "sft": ("base", "data", "out", "checkpoints", "metrics", "dvclive"),
    "grpo": ("model", "prompts", "spider", "out", "checkpoints", "metrics", "dvclive"),
}


def _gpus(monkeypatch, count: int):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_one_process_that_sees_several_gpus_is_refused_before_training(
    single, tmp_path, capsys, stage
):
    """launch.num_processes: 1 on an 8-GPU machine: transformers would wrap SFT in
    nn.DataParallel (8x the rows per step) and TRL refuse GRPO hours later. The stage stops
    at once instead, in one line saying what to set."""
    import importlib

    from stages import stage_main

    module = importlib.import_module(f"stages.{stage}")
    _gpus(single, 8)
    single.setattr(module, f"train_{stage}", lambda *a, **k: pytest.fail("training started"))
    single.chdir(tmp_path)  # the stage lock's folder
    argv = ["--params", str(REPO_ROOT / "params.yaml")]
    for flag in STAGE_FLAGS[stage]:
        argv += [f"--{flag}", str(tmp_path / flag)]
    assert stage_main(stage, module.main, module.arguments, argv=argv) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"{stage}: 8 GPUs are visible to one training process")
    assert "launch.num_processes to 8" in error and "CUDA_VISIBLE_DEVICES" in error
    assert "\n" not in error


def test_one_gpu_or_one_process_per_gpu_trains(single):
    _gpus(single, 1)
    check_one_process_per_gpu()
    _gpus(single, 0)
    check_one_process_per_gpu()
    _gpus(single, 8)
    _rank(single, 3, 8)  # a rank of launch.num_processes: 8
    check_one_process_per_gpu()
