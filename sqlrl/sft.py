"""Supervised fine-tuning: TRL SFTTrainer on the prepared prompt/completion rows.

- Completion-only loss (TRL's prompt/completion format) through the model's chat template,
  or, with `sft.completion_only_loss: false`, the loss on the prompt too: a model trained from
  scratch then also learns to model schemas and questions (measured on the CPU profile: more
  in-domain EX); `sft.prompt_loss_weight` < 1 weighs each prompt token below a completion
  token. The output layer runs only at the positions that carry a loss.
- LoRA through PEFT (`sft.use_lora`; rank, alpha, dropout, target modules from params), merged
  into the weights with `merge_and_unload`, or full fine-tuning (the CPU profile: LoRA on random
  weights does not learn). Either way the output is a plain model folder.
- bf16 and gradient checkpointing are set explicitly from params (TRL's defaults, both on, are
  wrong for a CPU); `sft.bf16: auto` picks bf16 only where it is fast (sqlrl/hardware.py).
- Curves (loss, learning rate, tokens/s) go to dvclive/sft/plots/metrics through DVCLive,
  which must not rewrite dvc.yaml (dvcyaml=False) nor make DVC experiments.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from sqlrl.errors import PipelineError
from sqlrl.hardware import resolve_bf16, set_torch_threads
from sqlrl.modeling import load_model_and_tokenizer, n_parameters, saved_dtype
from sqlrl.params import SftParams
from sqlrl.progress import trainer_progress


class SftDataError(PipelineError, ValueError):
    """Training rows would be cut or dropped by sft.max_length; the message says which."""


DVCLIVE_DIR = "dvclive/sft"
_SUMMARY_KEYS = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "total_flos",
    "train_loss",
)


def load_sft_dataset(path: str | Path):
    """The prepared rows as a datasets.Dataset of conversational prompt/completion pairs.
    Read with read_jsonl, so a malformed line is named by file and line (datasets would not)."""
    from datasets import Dataset

    from sqlrl.jsonio import read_jsonl

    rows = read_jsonl(path, ("prompt", "completion"))
    return Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])


def _throughput_callback():
    from transformers import TrainerCallback

    class Throughput(TrainerCallback):
        """Adds tokens/s (since the previous log) to each log; drops the end-of-run summary,
        which is not a curve (it goes to metrics/sft.json)."""

        def __init__(self):
            self.last_time = None
            self.last_tokens = 0
            self.last_log: dict = {}

        def on_train_begin(self, args, state, control, **kwargs):
            self.last_time = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is None:
                return
            for key in _SUMMARY_KEYS:
                logs.pop(key, None)
            now = time.perf_counter()
            tokens = logs.get("num_tokens")
            if tokens is not None and now > self.last_time:
                logs["tokens_per_second"] = (tokens - self.last_tokens) / (now - self.last_time)
                self.last_tokens, self.last_time = tokens, now
            if "loss" in logs:
                self.last_log = dict(logs)

    return Throughput()


def _trainer_class():
    import torch
    import torch.nn.functional as F
    from trl import SFTTrainer

    class CompletionLogitsSFTTrainer(SFTTrainer):
        """SFTTrainer whose loss runs the output layer only at the positions that carry a loss.

        The backbone runs on the whole sequence; the (vocab-sized) output layer only on the
        positions whose next-token label is not -100. On a CPU this is several times faster
        than TRL's tiled fused head, and the loss is the same token-mean cross-entropy.
        With `prompt_loss_weight` set (labels then mark the completion only), the prompt's
        tokens are trained on too, each weighing that much against a completion token.
        """

        prompt_loss_weight: float | None = None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            mode = "train" if model.training else "eval"
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            backbone = getattr(base, base.base_model_prefix)
            kwargs = {k: inputs[k] for k in ("attention_mask", "position_ids") if k in inputs}
            labels = inputs["labels"][:, 1:]
            completion = labels != -100
            weight = self.prompt_loss_weight
            if weight is None:
                mask, targets = completion, labels[completion]
            else:  # every real token: the prompt's from input_ids, weighted
                real = (
                    inputs["attention_mask"][:, 1:].bool()
                    if "attention_mask" in inputs
                    else torch.ones_like(completion)
                )
                mask = real | completion
                targets = inputs["input_ids"][:, 1:][mask]
                is_completion = completion[mask]
            # the backbone is called directly, so the mixed precision accelerate puts around
            # model.forward must be applied here
            device = inputs["input_ids"].device.type
            autocast = (
                torch.autocast(device_type=device, dtype=torch.bfloat16)
                if self.args.bf16
                else self.accelerator.autocast()
            )
            with autocast:
                hidden = backbone(
                    input_ids=inputs["input_ids"], use_cache=False, **kwargs
                ).last_hidden_state[:, :-1]
                logits = base.get_output_embeddings()(hidden[mask])
            logits = logits.float()
            if weight is None:
                loss_sum = F.cross_entropy(logits, targets, reduction="sum")
                n = num_items_in_batch if num_items_in_batch is not None else mask.sum()
                loss = loss_sum / torch.as_tensor(n, device=loss_sum.device).clamp(min=1)
            else:
                weights = torch.where(is_completion, 1.0, weight)
                losses = F.cross_entropy(logits, targets, reduction="none")
                loss = (losses * weights).sum() / weights.sum().clamp(min=1e-8)
                if num_items_in_batch is not None and self.model_accepts_loss_kwargs:
                    # the Trainer then skips its division by the accumulation steps
                    loss = loss / self.current_gradient_accumulation_steps
            with torch.no_grad():
                hits = logits.argmax(-1) == targets
                if weight is not None:  # accuracy on the completion, as without weighting
                    hits = hits[is_completion]
                self._metrics[mode]["mean_token_accuracy"].append(
                    hits.sum().item() / max(int(hits.numel()), 1)
                )
                if mode == "train":
                    self._total_train_tokens += int(
                        inputs["attention_mask"].sum().item()
                        if "attention_mask" in inputs
                        else inputs["input_ids"].numel()
                    )
                self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            if return_outputs:
                return loss, {"logits": logits}
            return loss

    return CompletionLogitsSFTTrainer


def check_rows_fit(rows_in: int, prepared_lengths: list[int], max_length: int) -> dict:
    """Rows in vs rows TRL will train on. TRL cuts rows longer than max_length and drops the
    ones whose answer was cut away, without a word; a cut or dropped row is an error here."""
    dropped = rows_in - len(prepared_lengths)
    cut = sum(n >= max_length for n in prepared_lengths)  # at the limit: cut (or exactly full)
    if dropped or cut:
        raise SftDataError(
            f"{dropped + cut} of {rows_in} SFT rows do not fit sft.max_length={max_length} "
            f"tokens ({dropped} dropped by TRL, {cut} cut at the limit, their SQL incomplete): "
            f"raise sft.max_length or lower prepare.max_prompt_tokens / prepare.sample_rows"
        )
    return {
        "rows_trained": len(prepared_lengths),
        "max_row_tokens": max(prepared_lengths, default=0),
    }


def _weighted_prompt_loss(params: SftParams) -> bool:
    """The prompt is trained on with a weight below a completion token's."""
    return not params.completion_only_loss and params.prompt_loss_weight < 1.0


def sft_config(params: SftParams, seed: int, output_dir: str, **overrides):
    import torch
    from trl import SFTConfig

    kwargs = dict(
        output_dir=output_dir,
        num_train_epochs=params.epochs,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=params.batch_size,
        gradient_accumulation_steps=params.grad_accum,
        max_length=params.max_length,
        bf16=resolve_bf16(params.bf16)[0],
        fp16=False,
        gradient_checkpointing=params.gradient_checkpointing,
        lr_scheduler_type=params.lr_scheduler,
        warmup_steps=params.warmup_ratio,
        weight_decay=params.weight_decay,
        # a weighted prompt loss needs labels that mark the completion (the trainer adds the prompt)
        completion_only_loss=params.completion_only_loss or _weighted_prompt_loss(params),
        packing=False,
        train_sampling_strategy="group_by_length" if params.group_by_length else "random",
        logging_steps=params.logging_steps,
        logging_first_step=True,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        dataset_num_proc=None,
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )
    kwargs.update(overrides)
    return SFTConfig(**kwargs)


def lora_config(params: SftParams):
    from peft import LoraConfig

    lora = params.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def train_sft(
    params: SftParams,
    seed: int,
    base_dir: str | Path,
    data_path: str | Path,
    out_dir: str | Path,
    dvclive_dir: str | None = DVCLIVE_DIR,
    torch_threads: int = 0,
    **config_overrides,
) -> dict:
    """Fine-tune models/base on sft.jsonl, save the merged model to out_dir, return metrics."""
    import torch
    from transformers import set_seed
    from transformers.integrations import DVCLiveCallback

    threads = set_torch_threads(torch_threads)
    set_seed(seed)
    SFTTrainer = _trainer_class()
    model, tokenizer = load_model_and_tokenizer(
        base_dir, attn_implementation=params.attn_implementation
    )
    save_dtype = getattr(torch, saved_dtype(base_dir))  # the base model's (bf16 for Qwen)
    model.config.use_cache = False
    dataset = load_sft_dataset(data_path)
    callbacks = [_throughput_callback(), trainer_progress("sft")]
    if dvclive_dir:
        from dvclive import Live

        shutil.rmtree(dvclive_dir, ignore_errors=True)
        callbacks.append(DVCLiveCallback(live=Live(dvclive_dir, dvcyaml=False, save_dvc_exp=False)))
    with tempfile.TemporaryDirectory(prefix="sft-") as tmp:
        args = sft_config(params, seed, tmp, **config_overrides)
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
            peft_config=lora_config(params) if params.use_lora else None,
        )
        rows = check_rows_fit(
            len(dataset), [len(ids) for ids in trainer.train_dataset["input_ids"]], args.max_length
        )
        if _weighted_prompt_loss(params):
            trainer.prompt_loss_weight = params.prompt_loss_weight
        start = time.perf_counter()
        result = trainer.train()
        wall = time.perf_counter() - start
        tokens = trainer._total_train_tokens if hasattr(trainer, "_total_train_tokens") else None
    trained = trainer.model
    if params.use_lora:
        trained = trained.merge_and_unload()
    trained = trained.to(save_dtype)  # not the fp32 a CPU computed in
    trained.config.use_cache = True
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    trained.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    last = callbacks[0].last_log
    metrics = {
        "final_loss": last.get("loss"),
        "mean_loss": result.training_loss,
        "final_token_accuracy": last.get("mean_token_accuracy"),
        "steps": result.global_step,
        "epochs": trainer.state.epoch,
        "examples": len(dataset),
        **rows,
        "dtype": str(save_dtype).removeprefix("torch."),
        "wall_seconds": round(wall, 1),
        "train_tokens": tokens,
        "tokens_per_second": round(tokens / wall, 1) if tokens else None,
        "n_params": n_parameters(trained),
        "use_lora": params.use_lora,
        "torch_threads": threads,
        "bf16": bool(args.bf16),
        "bf16_reason": resolve_bf16(params.bf16)[1],
    }
    return metrics


def write_json(path: str | Path, data: dict) -> None:
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
