"""The `grpo_parts` phase: what a reference (vLLM-rollout) GRPO step does besides generation,
timed apart on the policy GRPO trains: the LoRA merge/unmerge weight sync, the
importance-sampling log-prob pass and the update, on one step's sequences laid out as TRL lays
them out."""

from __future__ import annotations

import math
import random
import statistics
import time
from pathlib import Path

from sqlrl.train.gpu_rehearsal.common import quantiles
from sqlrl.train.gpu_rehearsal.device import cuda_sync
from sqlrl.train.gpu_rehearsal.grpo import grpo_params
from sqlrl.train.gpu_rehearsal.model import ENDOFTEXT_ID
from sqlrl.train.gpu_rehearsal.rows import grpo_rows


def step_sequences(tokenizer, rows: list[dict], grpo, seed: int, device):
    """One optimizer step's sequences as TRL lays them out: each prompt num_generations times,
    left-padded to the step's longest prompt, then max_completion_length completion tokens (a
    random-weight policy never stops early; the ids are seeded random ones). Returns
    (input_ids, attention_mask, advantages, prompt token counts)."""
    import torch

    texts = [
        tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in rows
    ]
    prompts = tokenizer(texts, add_special_tokens=False)["input_ids"]
    repeated = [ids for ids in prompts for _ in range(grpo.num_generations)]
    width, completion = max(map(len, repeated)), grpo.max_completion_length
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.full((len(repeated), width + completion), tokenizer.pad_token_id)
    mask = torch.zeros_like(input_ids)
    for i, ids in enumerate(repeated):
        input_ids[i, width - len(ids) : width] = torch.tensor(ids)
        mask[i, width - len(ids) :] = 1
    input_ids[:, width:] = torch.randint(
        0, ENDOFTEXT_ID, (len(repeated), completion), generator=generator
    )
    advantages = torch.randn(len(repeated), generator=generator)
    return input_ids.to(device), mask.to(device), advantages.to(device), list(map(len, prompts))


def completion_logps(model, input_ids, mask, completion: int):
    """Per-token log-probabilities of the completion, as TRL's GRPOTrainer computes them: its
    fused LM head, scoring only the completion positions."""
    labels = input_ids.masked_fill(mask == 0, -100)
    labels[:, :-completion] = -100
    out = model(input_ids=input_ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -completion:]


def sync_weights(model) -> int:
    """The weight sync a vLLM-rollout step starts with (TRL's VLLMGeneration.sync_weights on
    one GPU): merge the LoRA adapter, read every merged weight into the bf16 copy vLLM's
    load_weights makes, unmerge. Returns the bytes handed over."""
    import torch

    moved = 0
    with torch.no_grad():
        model.merge_adapter()
        for name, param in model.named_parameters():
            if model.prefix in name:  # the adapter itself: merged already, not in vLLM
                continue
            moved += param.to(torch.bfloat16).numel() * 2
        model.unmerge_adapter()
    return moved


def logprob_pass(model, input_ids, mask, completion: int, batch: int, autocast):
    """The importance-sampling pass a vLLM-rollout step makes before its update: the policy's
    log-probabilities of every rollout, no gradients, in per-device batches."""
    import torch

    with torch.no_grad(), autocast():
        return torch.cat(
            [
                completion_logps(model, input_ids[s : s + batch], mask[s : s + batch], completion)
                for s in range(0, len(input_ids), batch)
            ]
        )


def update_pass(model, optimizer, tensors, completion: int, batch: int, autocast) -> float:
    """One optimizer step over the rollouts: forward+backward per per-device batch (a clipped
    importance-ratio policy-gradient loss), gradient clipping, the optimizer step."""
    import torch

    input_ids, mask, old_logps, advantages = tensors
    passes = math.ceil(len(input_ids) / batch)
    total = 0.0
    for s in range(0, len(input_ids), batch):
        part = slice(s, s + batch)
        with autocast():
            logps = completion_logps(model, input_ids[part], mask[part], completion)
        kept = mask[part, -completion:].float()
        ratio = torch.exp(logps.float() - old_logps[part].float()).clamp(max=10.0)
        loss = -(ratio * advantages[part, None] * kept).sum() / kept.sum().clamp(min=1) / passes
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def run_grpo_parts(params, model_dir: Path, bundle: Path, steps: int, tiny: bool, budget):
    """What a reference GRPO step does besides generation, on the policy as GRPO loads it
    (sqlrl.train.grpo.load_policy: fp32 weights, bf16 autocast) with the reference LoRA: the
    weight sync, the log-prob pass and the update, timed apart. The first step is warm-up;
    seconds_per_step is the mean of the others."""
    import contextlib

    import torch
    from peft import get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    from sqlrl.hardware import resolve_bf16
    from sqlrl.model.modeling import lora_config
    from sqlrl.patches import completion_logits_only_on_cpu
    from sqlrl.train.grpo import POLICY_DTYPE, load_policy

    grpo, changes = grpo_params(params, steps, tiny)
    batch, passes = grpo.per_process(1)
    bf16 = resolve_bf16(grpo.bf16)[0]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def autocast():
        if not bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    model, tokenizer = load_policy(model_dir)
    model.to(device)
    add_fused_lm_head(model, temperature=grpo.temperature, outputs=("log_probs", "entropy"))
    model = get_peft_model(model, lora_config(grpo.lora))
    if grpo.gradient_checkpointing:  # as TRL 1.16 sets it up for a PEFT model
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=grpo.learning_rate
    )
    rows = grpo_rows(bundle, tiny, grpo.prompts_per_step)
    if not tiny:
        rows = random.Random(params.seed).sample(rows, grpo.prompts_per_step)
    input_ids, mask, advantages, prompt_tokens = step_sequences(
        tokenizer, rows, grpo, params.seed, device
    )
    completion = grpo.max_completion_length
    steps_timed, synced = [], 0
    with completion_logits_only_on_cpu():  # as train_grpo runs TRL's head (sqlrl/patches.py)
        for _ in range(steps):
            if steps_timed and budget.left() < 1.5 * sum(steps_timed[-1].values()):
                break
            times = {}
            cuda_sync()
            start = time.perf_counter()
            synced = sync_weights(model)
            cuda_sync()
            times["sync"], start = time.perf_counter() - start, time.perf_counter()
            old = logprob_pass(model, input_ids, mask, completion, batch, autocast)
            cuda_sync()
            times["logprob"], start = time.perf_counter() - start, time.perf_counter()
            update_pass(
                model, optimizer, (input_ids, mask, old, advantages), completion, batch, autocast
            )
            cuda_sync()
            times["update"] = time.perf_counter() - start
            steps_timed.append(times)
    timed = steps_timed[1:] or steps_timed
    return {
        "steps": len(steps_timed),
        "steps_asked": steps,
        "warmup_steps": 1 if len(steps_timed) > 1 else 0,
        "seconds_per_step": {
            part: round(statistics.fmean(t[part] for t in timed), 3)
            for part in ("sync", "logprob", "update")
        },
        "first_step_seconds": {part: round(s, 3) for part, s in steps_timed[0].items()},
        "prompts_per_step": len(rows),
        "sequences_per_step": len(input_ids),
        "sequence_tokens": input_ids.shape[1],
        "prompt_tokens": quantiles(prompt_tokens),
        "per_device_batch": batch,
        "passes_per_step": passes,
        "synced_mib": round(synced / 2**20, 1),
        "policy_dtype": POLICY_DTYPE,
        "bf16_autocast": bf16,
        "model_dir": model_dir.name,
        "overrides": changes,
    }
