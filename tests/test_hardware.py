"""bf16 `auto` and the torch thread rule (sqlrl/hardware.py), with the capability checks stubbed."""

from __future__ import annotations

import os

import pytest
import torch

from sqlrl import hardware


def _cpu(monkeypatch, *, mkldnn_bf16: bool, amx: bool, capability: str = "AVX512"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: mkldnn_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)


def test_auto_picks_bf16_on_a_cpu_with_amx(monkeypatch):
    _cpu(monkeypatch, mkldnn_bf16=True, amx=True)
    bf16, why = hardware.resolve_bf16("auto")
    assert bf16 and "AMX" in why


def test_auto_picks_fp32_on_avx512_bf16_without_amx(monkeypatch):
    _cpu(monkeypatch, mkldnn_bf16=True, amx=False)
    bf16, why = hardware.resolve_bf16("auto")
    assert not bf16 and "no AMX" in why


def test_auto_picks_fp32_where_bf16_is_emulated(monkeypatch):
    """An AVX2 CPU, or oneDNN limited to AVX2 (ONEDNN_MAX_CPU_ISA), even with AMX present."""
    _cpu(monkeypatch, mkldnn_bf16=False, amx=True, capability="AVX2")
    bf16, why = hardware.resolve_bf16("auto")
    assert not bf16 and "emulated" in why and "AVX2" in why


@pytest.mark.parametrize("supported", [True, False])
def test_auto_on_a_cuda_gpu_follows_the_device(monkeypatch, supported):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    assert hardware.resolve_bf16("auto")[0] is supported


@pytest.mark.parametrize("setting", [True, False])
def test_true_and_false_force_it_whatever_the_machine(monkeypatch, setting):
    _cpu(monkeypatch, mkldnn_bf16=False, amx=False, capability="AVX2")
    assert hardware.resolve_bf16(setting) == (setting, "set in params")


def test_this_machine_gets_a_decision_with_a_reason():
    bf16, why = hardware.resolve_bf16("auto")
    assert isinstance(bf16, bool) and why.startswith("auto: ")


def test_threads_follow_the_cpu_affinity_unless_set(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
        assert hardware.set_torch_threads(0) == 1 and torch.get_num_threads() == 1
        assert hardware.set_torch_threads(2) == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
