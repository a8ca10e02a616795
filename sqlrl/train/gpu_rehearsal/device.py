"""The GPU as the run sees it: what the device is, the allocator's cap to the reference card (a
larger card must not hide an out-of-memory the reference would hit), peak memory and the
process's own, and the CUDA synchronisation the timings need. torch is imported inside each
function."""

from __future__ import annotations

import gc

# The reference card: an 80 GB GPU, which shows CUDA about 79.6 GiB (81,559 MiB). A larger
# card is capped to it, less what the CUDA context already holds there.
REFERENCE_GPU_GIB = 79.6


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


def cap_memory(share: float, reference_gib: float) -> dict:
    """Limit PyTorch's allocator to `share` of the reference card, less what the CUDA context
    already holds on this one: a bigger card must not hide an out-of-memory the reference would
    hit. SFT has the whole card; GRPO's training side what vLLM's share leaves."""
    import torch

    if not torch.cuda.is_available():
        return {"cap_gib": None, "note": "no CUDA device: no cap"}
    free, total = torch.cuda.mem_get_info()
    context = max(total - free - torch.cuda.memory_reserved(), 0)
    cap = min(share * reference_gib * 2**30 - context, total - context)
    fraction = max(min(cap / total, 1.0), 0.0)
    torch.cuda.set_per_process_memory_fraction(fraction)
    return {
        "cap_gib": round(cap / 2**30, 2),
        "share_of_reference": share,
        "reference_gib": reference_gib,
        "context_gib": round(context / 2**30, 2),
        "fraction_of_device": round(fraction, 4),
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


def cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def process_memory() -> dict:
    """This process's peak resident memory (the CPU's share of a vLLM phase: on a CPU build the
    KV cache and the engine's weights live here), and on CUDA what the device holds now, the
    engine's allocations outside PyTorch's allocator included."""
    import resource

    import torch

    memory = {"peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        memory["device_used_gib"] = round((total - free) / 2**30, 2)
    return memory
