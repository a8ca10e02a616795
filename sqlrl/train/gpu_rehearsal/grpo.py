"""The `grpo` phase: GRPO steps through the pipeline's own train_grpo with the reference
GrpoParams and the execution reward on the bundle's databases, rolling out with transformers;
and the GRPO overrides every GRPO phase shares (the step count, --tiny's small steps)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from sqlrl.train.gpu_rehearsal.rows import grpo_rows

# --tiny, on a CPU: every token of a 2-layer model still meets Qwen's 152k-word output layer,
# which dominates a CPU step; tiny steps keep the plumbing exercised in seconds. GRPO: 8
# questions a step with 2 completions of 16 tokens each (SFT's: sft.TINY_SFT).
TINY_GRPO = dict(num_generations=2, prompts_per_step=8, max_completion_length=16, bf16=False)
NO_EOS_NOTE = (
    "random weights never emit <|im_end|>: completions run to max_completion_length "
    "and the execution reward is 0 (expected; this measures cost, not learning)"
)


def grpo_params(params, steps: int, tiny: bool):
    """The reference GrpoParams with the step count overridden, vLLM off (not installed on the
    GPU side), and on a CPU TINY_GRPO's small steps."""
    changes = {"steps": steps, "use_vllm": False}
    if tiny:
        changes.update(TINY_GRPO)
    return dataclasses.replace(params.grpo, **changes), changes


def run_grpo(params, model_dir: Path, bundle: Path, work: Path, steps: int, tiny: bool) -> dict:
    """GRPO through sqlrl.train.grpo.train_grpo with the reference GrpoParams and the pipeline's
    reward functions on the bundle's databases, rolling out with transformers."""
    from sqlrl.train.grpo import train_grpo
    from sqlrl.train.rewards import reward_functions

    grpo, changes = grpo_params(params, steps, tiny)
    rows = grpo_rows(bundle, tiny, grpo.prompts_per_step)
    start = time.perf_counter()
    metrics = train_grpo(
        params=grpo,
        seed=params.seed,
        sft_dir=model_dir,
        rows=rows,
        out_dir=work / "grpo_adapter",
        reward_funcs=reward_functions(grpo, bundle),  # no schema repair: see make_bundle
        checkpoint_dir=work / "checkpoints",
        dvclive_dir=None,
    )
    return {
        **metrics,
        "model_dir": model_dir.name,
        "prompts_given": len(rows),
        "generations": grpo.num_generations,
        "max_completion_length": grpo.max_completion_length,
        "overrides": changes,
        "phase_seconds": round(time.perf_counter() - start, 1),
        "note": NO_EOS_NOTE,
    }
