"""Supervised fine-tuning: TRL SFTTrainer on the prepared prompt/completion rows.

- Completion-only loss (TRL's prompt/completion format) through the model's chat template,
  or, with `sft.completion_only_loss: false`, the loss on the prompt too: a model trained from
  scratch then also learns to model schemas and questions (measured on the CPU profile: more
  in-domain EX); `sft.prompt_loss_weight` < 1 weighs each prompt token below a completion
  token (its own loss, DDP-safe; the output layer runs only where there is a loss), and
  `sft.prompt_loss_sample` < 1 estimates the prompt's share of it on a random sample of its
  tokens (the same expected gradient, less output-layer work). Otherwise TRL's own loss.
- Rows in the agent format (sqlrl/formats/agent.py: a tool call, the tool's answer, the
  final query) carry the tool's schema (`tools`, rendered by the chat template as GRPO renders
  it) and are trained with TRL's assistant_only_loss: its training variant of Qwen2.5's
  template marks the assistant's turns, so the tool's answer (and the turn markers around it)
  is never a target, as GRPO's tool_mask keeps it out of the RL loss. With the prompt trained
  on, the prompt keeps prompt_loss_weight and the tool's answer weighs 0 (tests/train/test_sft.py).
- LoRA through PEFT (`sft.use_lora`; rank, alpha, dropout, target modules from params), merged
  into the weights with `merge_and_unload`, or full fine-tuning (the CPU profile: LoRA on random
  weights does not learn). Either way the output is a plain model folder.
- bf16 and gradient checkpointing are set explicitly from params (TRL's defaults, both on, are
  wrong for a CPU); `sft.bf16: auto` picks bf16 only where it is fast (sqlrl/hardware.py).
- A step trains on sft.rows_per_step rows whatever the number of processes (each takes its
  share); rows of similar length are batched together with `sft.group_by_length`, and
  metrics/sft.json counts the tokens trained and the padding the batches carried.
- Checkpoints every sft.save_steps steps in the stage's --checkpoints folder; `sft.resume`
  continues an interrupted run of the same params, seed, data and base model
  (sqlrl/train/checkpoints.py). The model is saved atomically.
- Curves (loss, learning rate, tokens/s) go to dvclive/sft/plots/metrics through DVCLive,
  which must not rewrite dvc.yaml (dvcyaml=False) nor make DVC experiments.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path

from sqlrl.errors import PipelineError
from sqlrl.hardware import resolve_bf16, set_torch_threads
from sqlrl.model.modeling import (
    load_model_and_tokenizer,
    lora_config,
    n_parameters,
    saved_dtype,
)
from sqlrl.outputs import save_atomically
from sqlrl.params import SftParams
from sqlrl.progress import trainer_progress
from sqlrl.train.checkpoints import (
    dvclive_callback,
    prepare_checkpoints,
    run_fingerprint,
)


class SftDataError(PipelineError, ValueError):
    """Training rows would be cut or dropped by sft.max_length; the message says which."""


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

    def row(r: dict) -> dict:
        out = {"prompt": r["prompt"], "completion": r["completion"]}
        if "tools" in r:  # a JSON string, as TRL reads it: Arrow cannot hold free-form schemas
            out["tools"] = json.dumps(r["tools"])
        return out

    return Dataset.from_list([row(r) for r in rows])


def has_tool_turns(dataset) -> bool:
    """Whether any row's completion holds a tool's answer (the agent format)."""
    completions = dataset["completion"]
    return any(message.get("role") == "tool" for turns in completions for message in turns)


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


def _weighted_loss_trainer_class():
    import torch
    import torch.nn.functional as F
    from trl import SFTTrainer

    class PromptWeightedSFTTrainer(SFTTrainer):
        """SFTTrainer whose loss also trains on the prompt, each prompt token weighing
        `prompt_loss_weight` against a completion token (labels mark the completion).

        The model runs through its (possibly DDP-wrapped) forward, so gradients are synced;
        the vocabulary-sized output layer then runs only at the positions that carry a loss
        (on a CPU several times faster than TRL's fused head). The weighted sum is divided by
        the total weight of the optimizer step's batches on every process and scaled by the
        process count, as Trainer and TRL do with token counts: the same loss and gradients
        as TRL's for any gradient accumulation and world size (weight 1: tests/train/test_sft.py).
        """

        def __init__(
            self, *args, prompt_loss_weight: float, prompt_loss_sample: float = 1.0, **kwargs
        ):
            super().__init__(*args, **kwargs)
            self.prompt_loss_weight = prompt_loss_weight
            self.prompt_loss_sample = prompt_loss_sample
            self._logged_accuracy: list[float] = []
            self._trained_tokens = 0

        def _weights(self, inputs):
            """(positions that carry a loss, next-token targets there, their weights, which
            of them are completion tokens). A token the labels leave out once the completion
            has begun is the environment's (a tool's answer in the agent format, and the turn
            markers around it): no loss at all, neither prompt nor completion. In the query-
            only format there is none (the completion runs to the end of the row)."""
            labels = inputs["labels"][:, 1:]
            completion = labels != -100
            real = (
                inputs["attention_mask"][:, 1:].bool()
                if "attention_mask" in inputs
                else torch.ones_like(completion)
            )
            begun = completion.cumsum(dim=1) > 0
            mask = (real & ~begun) | completion
            is_completion = completion[mask]
            weights = torch.where(is_completion, 1.0, self.prompt_loss_weight)
            return mask, inputs["input_ids"][:, 1:][mask], weights, is_completion

        def _sample_prompt(self, mask, targets, weights, is_completion):
            """A random prompt_loss_sample share of the prompt's positions, drawn afresh for
            each batch, each weighing prompt_loss_weight / prompt_loss_sample; every completion
            position kept. The expected loss and gradient are the full weighted ones (the step
            is still divided by the full total weight), while the vocabulary-sized output
            layer and its softmax run at far fewer positions: on the cpu profile's rows 86% of
            the tokens are prompt."""
            keep = is_completion | (
                torch.rand(is_completion.shape, device=is_completion.device)
                < self.prompt_loss_sample
            )
            sampled = mask.clone()
            sampled[mask] = keep
            weights = torch.where(is_completion, weights, weights / self.prompt_loss_sample)
            return sampled, targets[keep], weights[keep], is_completion[keep]

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            """The step's batches, with their total weight on every process as the item count."""
            batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
            if num_items is None or not batches:
                return batches, num_items
            total = sum(self._weights(batch)[2].sum() for batch in batches).to(device)
            if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
                total = self.accelerator.gather(total).sum()
            return batches, total

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            mask, targets, weights, is_completion = self._weights(inputs)
            if model.training and self.prompt_loss_sample < 1.0:
                mask, targets, weights, is_completion = self._sample_prompt(
                    mask, targets, weights, is_completion
                )
            kwargs = {k: inputs[k] for k in ("attention_mask", "position_ids") if k in inputs}
            unwrapped = self.accelerator.unwrap_model(model)
            if hasattr(unwrapped, "get_base_model"):
                unwrapped = unwrapped.get_base_model()
            # autocast around the output layer too: it runs outside the model's forward
            device = inputs["input_ids"].device.type
            autocast = (
                torch.autocast(device_type=device, dtype=torch.bfloat16)
                if self.args.bf16
                else self.accelerator.autocast()
            )
            with autocast:
                outputs = model(
                    input_ids=inputs["input_ids"],
                    use_cache=False,
                    output_hidden_states=True,
                    logits_to_keep=1,  # the model's own logits: the last position only (unused)
                    **kwargs,
                )
                hidden = outputs.hidden_states[-1][:, :-1]  # after the final norm
                logits = unwrapped.get_output_embeddings()(hidden[mask])
            losses = F.cross_entropy(logits.float(), targets, reduction="none")
            if num_items_in_batch is None:  # evaluation: this batch alone
                loss = (losses * weights).sum() / weights.sum().clamp(min=1e-8)
            else:
                loss = (losses * weights).sum() / num_items_in_batch
                if self.args.average_tokens_across_devices:
                    loss = loss * self.accelerator.num_processes
            if model.training:
                self._record(logits, targets, is_completion, inputs)
            return (loss, {"logits": logits}) if return_outputs else loss

        @torch.no_grad()
        def _record(self, logits, targets, is_completion, inputs):
            """Completion-token accuracy and trained tokens, over all processes."""
            hits = (logits.argmax(-1) == targets)[is_completion].sum()
            real = inputs.get("attention_mask", torch.ones_like(inputs["input_ids"]))
            counts = torch.stack([hits, is_completion.sum(), real.sum()])
            if self.accelerator.num_processes > 1:
                counts = self.accelerator.reduce(counts, reduction="sum")
            hits, n, tokens = (int(c) for c in counts)
            self._logged_accuracy.append(hits / max(n, 1))
            self._trained_tokens += tokens

        def log(self, logs, *args, **kwargs):
            """A training log gets the accuracy since the last one and the tokens so far (the
            end-of-run summary neither, as with TRL's own loss)."""
            if "loss" in logs:
                if self._logged_accuracy:
                    accuracy = self._logged_accuracy
                    logs["mean_token_accuracy"] = sum(accuracy) / len(accuracy)
                    self._logged_accuracy = []
                logs["num_tokens"] = self._trained_tokens
            super().log(logs, *args, **kwargs)

    return PromptWeightedSFTTrainer


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


def _weighted_prompt_loss(params: SftParams, tool_turns: bool = False) -> bool:
    """The prompt is trained on with a weight below a completion token's or on a sample of its
    tokens; or, with tool turns, at any weight: TRL's assistant_only_loss would leave the prompt
    out of the loss."""
    return not params.completion_only_loss and (
        params.prompt_loss_weight < 1.0 or params.prompt_loss_sample < 1.0 or tool_turns
    )


class PaddingCounter:
    """Wraps the trainer's data collator to count, in every batch it builds, the real tokens
    (attention mask) and the padding: the share of compute a batching choice wastes."""

    def __init__(self, collator):
        self.collator = collator
        self.tokens = 0
        self.padding = 0

    def __call__(self, features):
        batch = self.collator(features)
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        real = int(mask.sum()) if mask is not None else ids.numel()
        self.tokens += real
        self.padding += ids.numel() - real
        return batch

    def as_metrics(self, accelerator) -> dict:
        """Totals over every process of this run (each counted its own batches)."""
        import torch

        counts = torch.tensor([self.tokens, self.padding], device=accelerator.device)
        if accelerator.num_processes > 1:
            counts = accelerator.reduce(counts, reduction="sum")
        tokens, padding = (int(c) for c in counts)
        return {
            "batch_tokens": tokens,
            "padding_tokens": padding,
            "padding_share": round(padding / max(tokens + padding, 1), 4),
        }


def sft_config(
    params: SftParams,
    seed: int,
    output_dir: str,
    world_size: int = 1,
    tool_turns: bool = False,
    **overrides,
):
    """TRL's SFTConfig from params: a step of sft.rows_per_step rows split over world_size
    processes; checkpoints every sft.save_steps steps (0: none). tool_turns (the agent
    format): only the assistant's turns are targets (assistant_only_loss)."""
    import torch
    from trl import SFTConfig

    batch, accumulation = params.per_process(world_size)
    kwargs = dict(
        output_dir=output_dir,
        num_train_epochs=params.epochs,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        max_length=params.max_length,
        bf16=resolve_bf16(params.bf16)[0],
        fp16=False,
        gradient_checkpointing=params.gradient_checkpointing,
        lr_scheduler_type=params.lr_scheduler,
        warmup_steps=params.warmup_ratio,
        weight_decay=params.weight_decay,
        # a weighted prompt loss needs labels that mark the completion (the trainer adds the prompt)
        completion_only_loss=(
            params.completion_only_loss or _weighted_prompt_loss(params, tool_turns)
        ),
        assistant_only_loss=tool_turns,
        packing=False,
        train_sampling_strategy="group_by_length" if params.group_by_length else "random",
        logging_steps=params.logging_steps,
        logging_first_step=True,
        save_strategy="steps" if params.save_steps else "no",
        save_steps=params.save_steps or 500,  # unused when save_strategy is "no"
        save_total_limit=2,
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


def train_sft(
    params: SftParams,
    seed: int,
    base_dir: str | Path,
    data_path: str | Path,
    out_dir: str | Path,
    dvclive_dir: str | Path | None,
    checkpoint_dir: str | Path | None = None,
    torch_threads: int = 0,
    **config_overrides,
) -> dict:
    """Fine-tune the model in base_dir on the rows of data_path, save the merged model to
    out_dir, return metrics; the training curves go to dvclive_dir (None: nowhere).
    checkpoint_dir should be outside DVC's outputs, so an interrupted run can resume from it
    (sft.resume); None keeps no checkpoints."""
    import torch
    from transformers import set_seed

    from sqlrl.train.launch import is_main_process, wait_for_everyone, world_size

    writer = is_main_process()  # the one process that deletes, writes and renames outputs
    threads = set_torch_threads(torch_threads)
    set_seed(seed)
    model, tokenizer = load_model_and_tokenizer(
        base_dir, attn_implementation=params.attn_implementation
    )
    save_dtype = getattr(torch, saved_dtype(base_dir))  # the base model's (bf16 for Qwen)
    model.config.use_cache = False
    dataset = load_sft_dataset(data_path)
    resume_from = None
    if checkpoint_dir is not None:
        fingerprint = run_fingerprint(params, seed, [base_dir, data_path], extra=config_overrides)
        resume_from = prepare_checkpoints(checkpoint_dir, fingerprint, params.resume, writer)
    wait_for_everyone()
    callbacks = [_throughput_callback(), trainer_progress("sft")]
    if dvclive_dir and writer:  # one writer of the curves
        callbacks.append(dvclive_callback(dvclive_dir, resume_from)[1])
    tool_turns = has_tool_turns(dataset)
    trainer_class, extra = _trainer_class(params, tool_turns)
    with contextlib.ExitStack() as stack:
        output_dir = checkpoint_dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="sft-")
        )
        if checkpoint_dir is None:
            config_overrides = {"save_strategy": "no", **config_overrides}
        args = sft_config(
            params, seed, str(output_dir), world_size(), tool_turns, **config_overrides
        )
        trainer = trainer_class(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
            peft_config=lora_config(params.lora) if params.use_lora else None,
            **extra,
        )
        lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
        rows = check_rows_fit(len(dataset), lengths, args.max_length)
        padding = PaddingCounter(trainer.data_collator)
        trainer.data_collator = padding  # the train dataloader is built in train(), from here
        start = time.perf_counter()
        result = trainer.train(resume_from_checkpoint=resume_from)
        wall = time.perf_counter() - start
    trained = _trained_model(trainer, params.use_lora, save_dtype)

    def save(folder: Path) -> None:
        if writer:
            trained.save_pretrained(folder)
            tokenizer.save_pretrained(folder)

    save_atomically(out_dir, save, writer, wait_for_everyone)
    tokens = round(sum(lengths) * trainer.state.epoch)  # every row once an epoch, no padding
    return {
        **_run_metrics(trainer, result, callbacks[0].last_log, wall, tokens),
        "examples": len(dataset),
        **rows,
        "dtype": str(save_dtype).removeprefix("torch."),
        **padding.as_metrics(trainer.accelerator),
        "resumed_from": Path(resume_from).name if resume_from else None,
        **({"tool_turns_masked": True} if tool_turns else {}),  # the agent format
        "n_params": n_parameters(trained),
        "use_lora": params.use_lora,
        "torch_threads": threads,
        "bf16_reason": resolve_bf16(params.bf16)[1],
    }


def _trainer_class(params: SftParams, tool_turns: bool = False) -> tuple[type, dict]:
    """TRL's SFTTrainer, or ours where the prompt is trained on with its own weight; with
    the keyword arguments it takes beyond SFTTrainer's."""
    if _weighted_prompt_loss(params, tool_turns):
        return _weighted_loss_trainer_class(), {
            "prompt_loss_weight": params.prompt_loss_weight,
            "prompt_loss_sample": params.prompt_loss_sample,
        }
    from trl import SFTTrainer

    return SFTTrainer, {}


def _trained_model(trainer, use_lora: bool, save_dtype):
    """The trained weights as one plain model (LoRA merged in) in the dtype it is saved in,
    not the fp32 a CPU computed in."""
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if use_lora:
        trained = trained.merge_and_unload()
    trained = trained.to(save_dtype)
    trained.config.use_cache = True
    return trained


def _run_metrics(trainer, result, last_log: dict, wall: float, tokens: int) -> dict:
    """What the run did and how fast, from the trainer's state and the last training log."""
    args = trainer.args
    return {
        "final_loss": last_log.get("loss"),
        "mean_loss": result.training_loss,
        "final_token_accuracy": last_log.get("mean_token_accuracy"),
        "steps": result.global_step,
        "epochs": trainer.state.epoch,
        "wall_seconds": round(wall, 1),
        "train_tokens": tokens,
        "tokens_per_second": round(tokens / wall, 1) if tokens else None,
        "rows_per_step": args.per_device_train_batch_size
        * args.gradient_accumulation_steps
        * trainer.accelerator.num_processes,
        "world_size": trainer.accelerator.num_processes,
        "bf16": bool(args.bf16),
    }
