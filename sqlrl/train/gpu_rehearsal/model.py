"""The `model` phase: a random-weight Qwen2 with Qwen2.5-Coder-3B-Instruct's shapes (or the
2-layer --tiny one) and the real tokenizer, saved as a model folder the pipeline's loaders
read."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from sqlrl.train.gpu_rehearsal.common import folder_mib

# Qwen/Qwen2.5-Coder-3B-Instruct's config.json (public): the shapes whose cost is rehearsed.
QWEN25_CODER_3B = dict(
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
    max_window_layers=36,
)
TINY = dict(
    QWEN25_CODER_3B,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,  # head_dim 32: the least vLLM's CPU attention takes
    num_key_value_heads=1,
    max_window_layers=2,
)
ENDOFTEXT_ID, IM_END_ID = 151643, 151645


def build_model_folder(out: Path, tiny: bool, seed: int) -> dict:
    """A random-weight Qwen2 in bf16 with the real tokenizer, saved as a model folder the
    pipeline's loaders read (sqlrl.model.modeling.load_model_and_tokenizer)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, set_seed

    from sqlrl.model.modeling import n_parameters
    from sqlrl.model.qwen_tokenizer import save_qwen25_tokenizer

    set_seed(seed)
    config = Qwen2Config(
        **(TINY if tiny else QWEN25_CODER_3B),
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=IM_END_ID,
        dtype="bfloat16",
    )
    start = time.perf_counter()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID, eos_token_id=[IM_END_ID, ENDOFTEXT_ID], pad_token_id=ENDOFTEXT_ID
    )
    built = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    save_qwen25_tokenizer(out)
    record = {
        "n_params": n_parameters(model),
        "config": "tiny" if tiny else "Qwen2.5-Coder-3B-Instruct",
        "dtype": "bfloat16",
        "build_seconds": round(built - start, 1),
        "save_seconds": round(time.perf_counter() - built, 1),
        "folder_gib": round(folder_mib(out) / 1024, 2),
    }
    del model
    return record
