"""The starting model: a pinned hub model, or a small Qwen2 model built from scratch.

- hub (`base.source: hub`): `base.model_id` at the pinned `base.revision`, loaded through
  transformers' own hub cache. models/base holds only `base.json` (what was resolved: repo id,
  revision, dtype, parameter count), so the weights are never copied into the DVC cache.
  `base.model_id` may also be a local folder standing in for a hub id (tests, air-gapped use).
- scratch (`base.source: scratch`): a byte-level BPE tokenizer trained on the prepared training
  text with Qwen2's own normalizer and pre-tokenizer and a ChatML chat template like Qwen's;
  with `base.tokenizer: trained-tools`, the same BPE with Qwen2.5's own chat template and its
  tool-call tokens, so the agent format trains on a small vocabulary (Qwen2.5's 152k-token
  output layer costs a small model more than the rest of it); with `base.tokenizer: qwen2.5`,
  Qwen2.5's real tokenizer (the rehearsal profile),
  and a Qwen2-architecture model initialised (seeded) from `base.architecture`. Both are saved
  with `save_pretrained`; the Auto classes reload them, with the same token ids whichever
  loader (transformers or the tokenizers library) is used.

`load_model_and_tokenizer(models/base)` loads either kind for the later stages.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from sqlrl.errors import PipelineError
from sqlrl.jsonio import write_json
from sqlrl.model.qwen_tokenizer import (
    QWEN25_CHAT_TEMPLATE,
    build_qwen25_tokenizer,
    qwen2_pre_tokenizer,
)
from sqlrl.outputs import save_atomically
from sqlrl.params import ArchitectureParams, BaseParams, LoraParams, parse_bool

BASE_RECORD = "base.json"
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Qwen2.5's tool-call markers: added tokens there (whole, never split), but not special
# (decode(skip_special_tokens=True) keeps them, which TRL's response parser relies on).
TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>"]
# ChatML like Qwen2.5's template (system default, then <|im_start|>role\ncontent<|im_end|>\n).
CHATML_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class BaseModelError(PipelineError, RuntimeError):
    """The base model cannot be resolved or loaded; the message says what to do."""


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int, tool_tokens: bool = False):
    """A byte-level BPE `tokenizers.Tokenizer` with Qwen2's normalizer and pre-tokenizer.

    Special tokens get the first ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2, then
    (with `tool_tokens`) <tool_call> 3, </tool_call> 4.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    reserved = SPECIAL_TOKENS + (TOOL_CALL_TOKENS if tool_tokens else [])
    tokenizer = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = qwen2_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in reserved],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def to_transformers_tokenizer(tokenizer, tool_template: bool = False):
    """Wrap a trained `tokenizers.Tokenizer` as transformers' Qwen2Tokenizer with ChatML, or
    (`tool_template`) with Qwen2.5's chat template and its tool-call tokens, which the
    tokenizer must have been trained with (`train_tokenizer(..., tool_tokens=True)`)."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    state = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    hf = Qwen2Tokenizer(
        vocab=state["vocab"],
        merges=merges,
        unk_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=32768,
    )
    hf.chat_template = CHATML_TEMPLATE
    if tool_template:
        missing = [t for t in TOOL_CALL_TOKENS if t not in state["vocab"]]
        if missing:
            raise ValueError(f"the trained tokenizer has no {missing}: train it with tool_tokens")
        hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_CALL_TOKENS])
        hf.chat_template = QWEN25_CHAT_TEMPLATE
    return hf


def training_texts(sft_jsonl: str | Path, chat_template: str | None = None) -> Iterator[str]:
    """The prepared training text: system prompt, schema + question, gold SQL; with a chat
    template, each row rendered whole as the model will see it (the agent's tool schema and
    tool-call markup included, which the messages' contents alone do not carry)."""
    if chat_template is not None:
        from transformers.utils.chat_template_utils import render_jinja_template
    with open(sft_jsonl, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            messages = row["prompt"] + row["completion"]
            if chat_template is None:
                yield from (message["content"] for message in messages)
            else:
                rendered, _ = render_jinja_template(
                    [messages], tools=row.get("tools"), chat_template=chat_template
                )
                yield rendered[0]


# --------------------------------------------------------------------------- model


def qwen2_config(arch: ArchitectureParams, tokenizer, dtype: str = "float32"):
    from transformers import Qwen2Config

    if arch.hidden_size % arch.num_attention_heads:
        raise ValueError("base.architecture.hidden_size must be a multiple of num_attention_heads")
    if arch.num_attention_heads % arch.num_key_value_heads:
        raise ValueError(
            "base.architecture.num_attention_heads must be a multiple of num_key_value_heads"
        )
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        use_cache=True,
        dtype=dtype,
    )


def build_scratch_model(arch: ArchitectureParams, tokenizer, seed: int, dtype: str = "float32"):
    """A Qwen2ForCausalLM with seeded random weights."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM, set_seed

    set_seed(seed)
    config = qwen2_config(arch, tokenizer, dtype)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[config.eos_token_id, config.bos_token_id],
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    return model


def n_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def build_scratch(
    params: BaseParams, seed: int, sft_jsonl: str | Path, out_dir: str | Path
) -> dict:
    """Train the tokenizer, build the model, save both into out_dir; return metrics."""
    out_dir = Path(out_dir)
    arch = params.architecture
    if params.tokenizer == "qwen2.5":  # the reference model's own (the GPU path rehearsed)
        tokenizer = build_qwen25_tokenizer()
    else:  # trained, or trained-tools: a small vocabulary that can call tools
        tools = params.tokenizer == "trained-tools"
        texts = training_texts(sft_jsonl, QWEN25_CHAT_TEMPLATE if tools else None)
        trained = train_tokenizer(texts, arch.vocab_size, tool_tokens=tools)
        tokenizer = to_transformers_tokenizer(trained, tool_template=tools)
    model = build_scratch_model(arch, tokenizer, seed, params.dtype)
    n = n_parameters(model)
    embed = model.get_input_embeddings().weight.numel()
    record = {
        "source": "scratch",
        "model_type": "qwen2",
        "dtype": params.dtype,
        "tokenizer": params.tokenizer,
        "n_params": n,
        "n_params_non_embedding": n - embed,
        "vocab_size": len(tokenizer),
    }

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        write_json(folder / BASE_RECORD, record)

    save_atomically(out_dir, save)
    return record


# --------------------------------------------------------------------------- hub


def _offline() -> bool:
    return parse_bool(os.environ.get("HF_HUB_OFFLINE") or "0")


def _hub_help(model_id: str, revision: str) -> str:
    return (
        f"download it once with network access: `HF_HUB_OFFLINE=0 hf download {model_id} "
        f"--revision {revision}` (it goes to the Hugging Face cache, HF_HOME), or set "
        f"base.model_id to a local folder holding the model"
    )


def resolve_hub_model(model_id: str, revision: str) -> tuple[str, str | None]:
    """(path to load from, resolved commit). A local folder is used as is (revision None)."""
    if Path(model_id).is_dir():
        return str(Path(model_id).resolve()), None
    if not revision:
        raise BaseModelError(f"base.revision is empty for {model_id!r}: pin a commit hash")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        path = snapshot_download(
            model_id,
            revision=revision,
            local_files_only=_offline(),
            allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.py"],
        )
    except LocalEntryNotFoundError as exc:
        why = (
            "HF_HUB_OFFLINE=1 and it is not in the local Hugging Face cache"
            if _offline()
            else "the hub is unreachable and it is not in the local Hugging Face cache"
        )
        raise BaseModelError(
            f"{model_id}@{revision}: {why}; {_hub_help(model_id, revision)}"
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise BaseModelError(
            f"{model_id}@{revision}: no such repository or revision on the "
            f"hub ({type(exc).__name__}); check base.model_id and "
            f"base.revision"
        ) from exc
    except OSError as exc:  # connection errors
        raise BaseModelError(
            f"{model_id}@{revision}: the hub is unreachable ({exc}); "
            f"{_hub_help(model_id, revision)}"
        ) from exc
    return path, Path(path).name


def record_hub(params: BaseParams, out_dir: str | Path) -> dict:
    """Resolve and load the pinned hub model once (checks it), write models/base/base.json."""
    import torch
    from transformers import AutoModelForCausalLM

    path, resolved = resolve_hub_model(params.model_id, params.revision)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, params.dtype))
    record = {
        "source": "hub",
        "repo_id": params.model_id,
        "revision": resolved or params.revision or None,
        "local_folder": resolved is None,
        "dtype": params.dtype,
        "n_params": n_parameters(model),
        "model_type": model.config.model_type,
    }
    if record["local_folder"]:
        record["repo_id"] = str(Path(params.model_id).resolve())
    save_atomically(out_dir, lambda folder: write_json(folder / BASE_RECORD, record))
    return record


def build_base(params: BaseParams, seed: int, sft_jsonl: str | Path, out_dir: str | Path) -> dict:
    """models/base: built from scratch, or the record of the pinned hub model it stands for."""
    if params.source == "scratch":
        return build_scratch(params, seed, sft_jsonl, out_dir)
    return record_hub(params, out_dir)


# --------------------------------------------------------------------------- loading


def read_base_record(model_dir: str | Path) -> dict | None:
    path = Path(model_dir) / BASE_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def model_location(model_dir: str | Path) -> tuple[str, str | None]:
    """Where from_pretrained should load `model_dir` from: itself, or the pinned hub model."""
    record = read_base_record(model_dir)
    if record and record.get("source") == "hub":
        if record.get("local_folder"):
            return record["repo_id"], None
        return resolve_hub_model(record["repo_id"], record["revision"])
    return str(model_dir), None


def lora_config(lora: LoraParams):
    """PEFT's LoraConfig for a causal LM from a `lora` params section (sft or grpo)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    path, _ = model_location(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    # transformers keeps HF_HUB_OFFLINE as an init argument, and save_pretrained would write
    # it into the next model folder: an environment variable in an output's hash
    tokenizer.init_kwargs.pop("local_files_only", None)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def saved_dtype(model_dir: str | Path) -> str:
    """The dtype a model folder is stored in (its base record's, else its config's): the
    dtype every stage saves its output in, whatever it computed in."""
    record = read_base_record(model_dir) or {}
    if record.get("dtype"):
        return record["dtype"]
    path, _ = model_location(model_dir)
    config = json.loads((Path(path) / "config.json").read_text())
    return config.get("dtype") or config.get("torch_dtype") or "float32"


def compute_dtype(model_dir: str | Path) -> str:
    """The dtype to train and generate in: the saved one on a GPU; float32 on a CPU, where
    bf16 matrix products are slow, or emulated about 33x slower without AVX-512 BF16."""
    import torch

    return saved_dtype(model_dir) if torch.cuda.is_available() else "float32"


def load_model_and_tokenizer(
    model_dir: str | Path, dtype: str | None = None, attn_implementation: str | None = None
):
    """Load models/base (either kind), models/sft or any save_pretrained folder, in `dtype`
    or compute_dtype(model_dir)."""
    import torch
    from transformers import AutoModelForCausalLM

    path, _ = model_location(model_dir)
    kwargs = {"dtype": getattr(torch, dtype or compute_dtype(model_dir))}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model, load_tokenizer(model_dir)
