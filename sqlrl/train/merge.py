"""Merge the GRPO LoRA adapter onto the SFT model -> models/final, a plain safetensors model.

The result loads with AutoModelForCausalLM alone (no PEFT, no adapter) and carries the
tokenizer and its chat template, so serving and publishing need nothing else.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from sqlrl.data.prompt_settings import PROMPT_SETTINGS_FILE
from sqlrl.model.modeling import load_model_and_tokenizer, saved_dtype
from sqlrl.outputs import save_atomically

log = logging.getLogger(__name__)


def merge_adapter(sft_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> dict:
    """Fold the adapter into the SFT weights and save; returns what was merged."""
    import torch
    from peft import PeftModel

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter_dir}: no adapter_config.json (run the grpo stage)")
    model, tokenizer = load_model_and_tokenizer(sft_dir)
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    merged = merged.to(getattr(torch, saved_dtype(sft_dir)))  # the SFT model's (bf16 for Qwen)

    def save(folder: Path) -> None:
        merged.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        settings = Path(sft_dir) / PROMPT_SETTINGS_FILE  # the prompts it was trained on
        if settings.is_file():
            shutil.copy2(settings, folder / PROMPT_SETTINGS_FILE)
        else:
            log.warning(
                "%s is missing, so %s will not serve without every prompt setting given as a "
                "flag (rerun `dvc repro sft`)",
                settings,
                out_dir,
            )

    save_atomically(out_dir, save)
    return {
        "sft": str(sft_dir),
        "adapter": str(adapter_dir),
        "parameters": sum(p.numel() for p in merged.parameters()),
        "dtype": str(merged.dtype).removeprefix("torch."),
    }  # the SFT model's (bf16 for Qwen)
