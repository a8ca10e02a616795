"""What this machine can do fast: torch threads and bf16, decided by one rule for every stage.

bf16 `auto` (measured on the default model, SFT forward + backward, 2 threads):
- a CPU with AVX-512 BF16 but no AMX: fp32 3.1k tokens/s, bf16 autocast 2.4k (slower);
- a CPU with only AVX2 (or oneDNN limited to it): bf16 is emulated, about 33x slower than fp32;
- so on a CPU, bf16 autocast only with AMX tiles (and oneDNN allowed to use bf16); fp32 elsewhere.
- on a CUDA GPU, bf16 where the device supports it.
"""

from __future__ import annotations

import os

AUTO = "auto"


def usable_cores() -> int:
    """The cores this process may run on (CPU affinity: a container or taskset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity call
        return os.cpu_count() or 1


def local_processes() -> int:
    """Training processes on this machine: LOCAL_WORLD_SIZE under `accelerate launch` or
    torchrun, else 1. They share the cores, so each sizes its threads and workers by it."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def cores_per_process(processes: int | None = None) -> int:
    """One process's share of the usable cores (at least one), among `processes` (default:
    the training processes running on this machine)."""
    return max(1, usable_cores() // (processes or local_processes()))


def set_torch_threads(requested: int = 0) -> int:
    """torch's intra-op threads: `requested`, or (0) one per core of this process's share.
    Runs are identical for a given thread count, not across thread counts."""
    import torch

    threads = requested if requested > 0 else cores_per_process()
    torch.set_num_threads(threads)
    return threads


def cpu_runs_bf16_natively() -> tuple[bool, str]:
    """(native, why): bf16 matrix products in hardware (AMX) and oneDNN allowed to use them
    (ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY can limit both, e.g. to AVX2)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False, f"oneDNN has no bf16 kernels here (ATen capability {capability}): emulated"
    if not torch.cpu._is_amx_tile_supported():
        return False, (
            f"no AMX (ATen capability {capability}): AVX-512 bf16 autocast was "
            f"measured slower than fp32"
        )
    return True, f"AMX bf16 (ATen capability {capability})"


def resolve_bf16(setting: bool | str) -> tuple[bool, str]:
    """bf16 autocast or not for a `*.bf16` param (true, false or auto), and why."""
    if isinstance(setting, bool):
        return setting, "set in params"
    if setting != AUTO:
        raise ValueError(f"bf16 must be true, false or {AUTO!r}, got {setting!r}")
    import torch

    if torch.cuda.is_available():
        supported = torch.cuda.is_bf16_supported()
        return supported, f"auto: CUDA device {'supports' if supported else 'lacks'} bf16"
    native, why = cpu_runs_bf16_natively()
    return native, f"auto: {why}"
