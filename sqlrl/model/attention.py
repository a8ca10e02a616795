"""Grouped-query attention without copying the KV cache, for generation (and GRPO) on a CPU.

transformers' sdpa attention hands torch's kernel grouped keys and values natively only when
there is no attention mask; a left-padded batch always has one, so every layer expands its
whole KV cache to one copy per query head (`repeat_kv`) at every decoding step. For the cpu
profile's model (4 query heads over 2 KV heads) that copy was half of generation's time.
torch's `scaled_dot_product_attention(..., enable_gqa=True)` takes the mask and the grouped
heads as they are on a CPU, and computes the same numbers (greedy outputs are token for token
the same; tests/model/test_attention.py).

The implementation is registered with transformers' public AttentionInterface and
AttentionMaskInterface under GROUPED_SDPA (the mask is sdpa's boolean one), and
`grouped_query_attention(model)` switches a model to it where it helps: sdpa on a CPU, with
fewer KV heads than query heads. GRPO's policy uses it too (its rollouts are generation;
its gradients match sdpa's to 2e-7, its training pass is ~5% faster). On CUDA, sdpa with a
mask and grouped heads falls back to its slowest kernel, so a GPU model keeps what it has.
"""

from __future__ import annotations

GROUPED_SDPA = "sqlrl_grouped_sdpa"


def grouped_sdpa_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **_
):
    """sdpa over (batch, heads, length, dim) tensors with KV heads shared by query-head
    groups; the output as (batch, length, heads, dim), as transformers' attention returns."""
    import torch

    mask = attention_mask
    if mask is not None and mask.shape[-1] != key.shape[-2]:
        mask = mask[..., : key.shape[-2]]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
        is_causal=bool(causal and mask is None and query.shape[2] > 1),
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def register_grouped_sdpa() -> str:
    """Register the attention and its mask with transformers (idempotent); its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    return GROUPED_SDPA


def grouped_query_attention(model):
    """`model`, switched to GROUPED_SDPA when it runs sdpa on a CPU with grouped KV heads;
    unchanged otherwise (eager or flash attention, a GPU machine, one KV head per query head)."""
    import torch

    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if (
        getattr(config, "_attn_implementation", None) != "sdpa"
        or model.device.type != "cpu"
        or torch.cuda.is_available()  # a Trainer moves a CPU-loaded model to the GPU later
        or not heads
        or kv_heads >= heads
    ):
        return model
    model.set_attn_implementation(register_grouped_sdpa())
    return model
