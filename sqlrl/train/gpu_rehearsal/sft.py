"""The `sft` and `sft_random` phases: SFT through the pipeline's own train_sft with the
reference SftParams, and StepClock, which times each optimizer step and counts its tokens from
outside the trainer so that the warm-up steps stay out of tokens/s."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from sqlrl.jsonio import read_jsonl
from sqlrl.train.gpu_rehearsal.common import SFT_KEYS
from sqlrl.train.gpu_rehearsal.device import cuda_sync

# --tiny, on a CPU: every token of a 2-layer model still meets Qwen's 152k-word output layer,
# which dominates a CPU step; tiny steps keep the plumbing exercised in seconds. SFT: one row a
# step (GRPO's: grpo.TINY_GRPO).
TINY_SFT = dict(batch_size=1, rows_per_step=1)


class StepClock:
    """Per optimizer step: when it ended, and the tokens its training forward passes took (real
    and with padding), through torch's global hooks, since train_sft builds its trainer inside.
    With it the first steps (kernel selection, allocator growth) stay out of tokens/s."""

    DECODER = "Qwen2Model"  # called once per forward pass, with the batch as keywords

    def __enter__(self):
        from torch.nn.modules.module import register_module_forward_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.ends, self.tokens, self.padded = [], [], []
        self._real, self._all = 0, 0
        self._handles = [
            register_module_forward_hook(self._forward, with_kwargs=True),
            register_optimizer_step_post_hook(self._stepped),
        ]
        return self

    def __exit__(self, *exc_info):
        for handle in self._handles:
            handle.remove()

    def _forward(self, module, args, kwargs, output):
        if type(module).__name__ != self.DECODER or not module.training:
            return
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is None:
            return
        self._all += ids.numel()
        real = mask.sum() if mask is not None and mask.dim() == 2 else ids.numel()
        self._real = self._real + real  # a device tensor: no synchronisation per pass

    def _stepped(self, optimizer, args, kwargs):
        cuda_sync()
        self.ends.append(time.perf_counter())
        self.tokens.append(int(self._real))
        self.padded.append(self._all)
        self._real, self._all = 0, 0

    def summary(self, warmup: int) -> dict:
        """Throughput over the steps after the first `warmup` ones (at least one: the first
        step always carries one-time costs)."""
        timed = len(self.ends) - warmup
        if timed < 1:
            return {
                "steps": 0,
                "warmup_steps": warmup,
                "note": f"{len(self.ends)} step(s) ran: none after the warm-up",
            }
        seconds = self.ends[-1] - self.ends[warmup - 1]
        tokens, padded = sum(self.tokens[warmup:]), sum(self.padded[warmup:])
        return {
            "steps": timed,
            "warmup_steps": warmup,
            "seconds": round(seconds, 3),
            "seconds_per_step": round(seconds / timed, 3),
            "tokens": tokens,
            "padded_tokens": padded,
            "padding_share": round(1 - tokens / padded, 4) if padded else None,
            "tokens_per_second": round(tokens / seconds, 1),
            "padded_tokens_per_second": round(padded / seconds, 1),
        }


def sft_params(params, tiny: bool):
    return dataclasses.replace(params.sft, **TINY_SFT) if tiny else params.sft


def run_sft(params, base_dir: Path, data: Path, out_dir: Path, steps: int, warmup: int, tiny: bool):
    """SFT through sqlrl.train.sft.train_sft with the reference SftParams; only the step count
    (and on a CPU, bf16 autocast and TINY_SFT's step size) is overridden. `timed` leaves the
    first `warmup` steps out; train_sft's own tokens_per_second includes them."""
    from sqlrl.train.sft import train_sft

    params_sft = sft_params(params, tiny)
    overrides = {"max_steps": steps}
    if tiny:
        overrides["bf16"] = False  # no bf16 autocast on a CPU
    rows = len(read_jsonl(data, SFT_KEYS))
    start = time.perf_counter()
    with StepClock() as clock:
        metrics = train_sft(
            params_sft, params.seed, base_dir, data, out_dir, dvclive_dir=None, **overrides
        )
    return {
        **metrics,
        "rows_given": rows,
        "data": data.name,
        "overrides": {**overrides, **(TINY_SFT if tiny else {})},
        "timed": clock.summary(warmup),
        "phase_seconds": round(time.perf_counter() - start, 1),
    }
