"""SFT on a tiny scratch model: full fine-tuning and LoRA, both ending in a plain model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from sqlrl.model.modeling import build_base
from sqlrl.params import ArchitectureParams
from sqlrl.train.sft import load_sft_dataset, train_sft
from tests.repo_tools import fixed_params

ARCH = ArchitectureParams(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    vocab_size=300,
)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Answer with SQL."},
                {
                    "role": "user",
                    "content": f"Database schema:\nsinger | id, name\n\nQuestion: name of singer {i}?",
                },
            ],
            "completion": [
                {"role": "assistant", "content": f"SELECT name FROM singer WHERE id = {i}"}
            ],
            "db_id": "x",
        }
        for i in range(24)
    ]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = dataclasses.replace(
        fixed_params().base,
        source="scratch",
        dtype="float32",
        tokenizer="trained",
        architecture=ARCH,
    )
    build_base(base, 0, root / "sft.jsonl", root / "base")
    return root


def _params(**changes):
    """SFT params for the tiny model: every setting a test here depends on is written out"""
    sft = dataclasses.replace(
        fixed_params().sft,
        use_lora=False,
        epochs=1.0,
        batch_size=8,
        rows_per_step=8,
        max_length=128,
        logging_steps=1,
        bf16=False,
        gradient_checkpointing=False,
        learning_rate=3e-3,
        lr_scheduler="cosine",
        warmup_ratio=0.03,
        weight_decay=0.0,
        group_by_length=True,
        attn_implementation="eager",
        completion_only_loss=False,
        prompt_loss_weight=0.1,
        save_steps=0,
        resume=False,
    )
    return dataclasses.replace(sft, **changes)


def test_dataset_is_conversational_prompt_completion(base_dir):
    ds = load_sft_dataset(base_dir / "sft.jsonl")
    assert ds.column_names == ["prompt", "completion"]
    assert ds[0]["completion"][0]["role"] == "assistant"


def test_full_fine_tuning_writes_a_plain_model_metrics_and_curves(base_dir, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    from sqlrl.hardware import usable_cores

    monkeypatch.chdir(base_dir)
    out = base_dir / "out_full"
    metrics = train_sft(
        _params(use_lora=False),
        0,
        base_dir / "base",
        base_dir / "sft.jsonl",
        out,
        dvclive_dir="dvclive/sft",
    )
    assert metrics["steps"] == 3 and metrics["epochs"] == 1.0
    tokens, wall = metrics["train_tokens"], metrics["wall_seconds"]  # wall rounded to 0.1 s
    assert tokens / (wall + 0.05) <= metrics["tokens_per_second"] <= tokens / (wall - 0.05)
    assert (metrics["bf16"], metrics["bf16_reason"]) == (False, "set in params")
    assert metrics["torch_threads"] == usable_cores()
    # not a terminal (pytest captures stderr): plain progress lines, the last one complete
    assert "sft: 100% 3/3 [" in capsys.readouterr().err
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "qwen2"
    plots = base_dir / "dvclive/sft/plots/metrics"
    curves = {}
    for name in ("loss", "learning_rate", "tokens_per_second"):
        path = plots / "train" / f"{name}.tsv"
        path = path if path.is_file() else plots / f"{name}.tsv"
        header, *lines = path.read_text().splitlines()
        column = header.split("\t").index(name)
        curves[name] = [
            (
                int(line.split("\t")[header.split("\t").index("step")]),
                float(line.split("\t")[column]),
            )
            for line in lines
        ]
    # the curves dvc plots draws: every logged step (logging_steps 1 here), real values
    assert [step for step, _ in curves["loss"]] == [0, 1, 2]  # DVCLive counts from 0
    assert all(value > 0 for _, value in curves["tokens_per_second"])
    assert curves["loss"][-1][1] == pytest.approx(metrics["final_loss"])
    assert metrics["final_loss"] < curves["loss"][0][1]  # it learnt
    assert not (base_dir / "dvc.yaml").exists()  # DVCLive must not write a dvc.yaml
    # seeded: the same run gives the same weights
    again = train_sft(
        _params(use_lora=False),
        0,
        base_dir / "base",
        base_dir / "sft.jsonl",
        base_dir / "out_again",
        dvclive_dir=None,
    )
    assert again["final_loss"] == metrics["final_loss"]
    a = AutoModelForCausalLM.from_pretrained(base_dir / "out_again").state_dict()
    b = model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_lora_is_merged_into_a_plain_model(base_dir):
    from transformers import AutoModelForCausalLM

    out = base_dir / "out_lora"
    params = _params(
        use_lora=True,
        lora=dataclasses.replace(
            fixed_params().sft.lora, r=4, alpha=8, target_modules=["q_proj", "v_proj"]
        ),
    )
    metrics = train_sft(params, 0, base_dir / "base", base_dir / "sft.jsonl", out, dvclive_dir=None)
    assert metrics["use_lora"] and metrics["steps"] == 3
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in k for k in model.state_dict())


def _prompt_nll(model_dir, base_dir):
    """Mean negative log-likelihood of the prompt tokens (system + user turns)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    row = json.loads((base_dir / "sft.jsonl").read_text().splitlines()[0])
    ids = tokenizer.apply_chat_template(row["prompt"], return_tensors="pt", return_dict=True)
    with torch.no_grad():
        return model(**ids, labels=ids["input_ids"]).loss.item()


@pytest.mark.slow  # ~20-80 s: the fast tier stays a few minutes
def test_prompt_loss_trains_on_the_prompt_tokens(base_dir):
    """completion_only_loss=False: the model also learns the schema/question text."""
    nll = {}
    for only_completion in (True, False):
        out = base_dir / f"out_prompt_loss_{only_completion}"
        train_sft(
            _params(
                use_lora=False, epochs=4.0, learning_rate=2e-2, completion_only_loss=only_completion
            ),
            0,
            base_dir / "base",
            base_dir / "sft.jsonl",
            out,
            dvclive_dir=None,
        )
        nll[only_completion] = _prompt_nll(out, base_dir)
    assert nll[False] < nll[True] - 0.5, nll


@pytest.mark.slow  # ~20-80 s: the fast tier stays a few minutes
def test_weighted_prompt_loss_trains_the_prompt_less(base_dir):
    """prompt_loss_weight < 1: the prompt is still learnt (lower prompt loss than with the
    completion-only loss), but less than with full weight (higher prompt loss). Both by a
    margin: 3.2 (full) < 3.5 (0.2) < 5.2 (none) when this was written."""

    def prompt_nll(**changes):
        out = base_dir / f"out_weighted_{changes}"
        train_sft(
            _params(use_lora=False, epochs=4.0, learning_rate=2e-2, **changes),
            0,
            base_dir / "base",
            base_dir / "sft.jsonl",
            out,
            dvclive_dir=None,
        )
        return _prompt_nll(out, base_dir)

    none = prompt_nll(completion_only_loss=True)
    weighted = prompt_nll(completion_only_loss=False, prompt_loss_weight=0.2)
    full = prompt_nll(completion_only_loss=False, prompt_loss_weight=1.0)
    assert full + 0.1 < weighted < none - 0.5, (full, weighted, none)


def test_rows_longer_than_max_length_fail_loudly_instead_of_vanishing(base_dir):
    """TRL cuts rows past max_length and drops those whose answer is gone; here that is an
    error that says how many rows and what to change, and nothing is written."""
    from sqlrl.train.sft import SftDataError

    out = base_dir / "out_too_long"
    with pytest.raises(SftDataError, match=r"24 of 24 SFT rows do not fit sft.max_length=16"):
        train_sft(
            _params(use_lora=False, max_length=16),
            0,
            base_dir / "base",
            base_dir / "sft.jsonl",
            out,
            dvclive_dir=None,
        )
    assert not out.exists()


def test_rows_trained_are_reported(base_dir):
    metrics = train_sft(
        _params(use_lora=False),
        0,
        base_dir / "base",
        base_dir / "sft.jsonl",
        base_dir / "out_counted",
        dvclive_dir=None,
    )
    assert metrics["examples"] == metrics["rows_trained"] == 24
    assert 0 < metrics["max_row_tokens"] < 128


def test_lora_on_a_bf16_base_saves_a_bf16_model(base_dir, tmp_path):
    """The merged SFT model keeps the base model's dtype (bf16 for Qwen), not fp32."""
    from safetensors import safe_open

    base = dataclasses.replace(
        fixed_params().base,
        source="scratch",
        dtype="bfloat16",
        tokenizer="trained",
        architecture=ARCH,
    )
    build_base(base, 0, base_dir / "sft.jsonl", tmp_path / "base")
    params = _params(
        use_lora=True,
        lora=dataclasses.replace(
            fixed_params().sft.lora, r=4, alpha=8, target_modules=["q_proj", "v_proj"]
        ),
    )
    metrics = train_sft(
        params, 0, tmp_path / "base", base_dir / "sft.jsonl", tmp_path / "sft", dvclive_dir=None
    )
    assert metrics["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "sft" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_weighted_loss_at_weight_one_is_trls_loss_with_the_same_gradients(
    base_dir, tmp_path, grad_accum
):
    """At weight 1 (every token alike) the prompt-weighted loss is TRL's own loss on prompt and
    completion: the same loss and gradients for one optimizer step, also when the step's
    rows are split over two accumulation passes of different lengths (the total weight of
    the step divides the sum, as TRL's token count does)."""
    from transformers import TrainerCallback
    from trl import SFTTrainer

    from sqlrl.model.modeling import load_model_and_tokenizer
    from sqlrl.train.sft import _weighted_loss_trainer_class, sft_config

    class Gradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            self.grads = {
                n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
            }

    def one_step(trainer_class, completion_only_loss, **extra):
        model, tokenizer = load_model_and_tokenizer(base_dir / "base")
        params = _params(
            completion_only_loss=completion_only_loss,
            prompt_loss_weight=1.0,  # TRL: the loss on every token; ours: labels on the completion
            batch_size=8 // grad_accum,
            rows_per_step=8,
            group_by_length=False,
        )
        args = sft_config(params, 0, str(tmp_path / "out"), max_steps=1, max_grad_norm=0.0)
        capture = Gradients()
        trainer = trainer_class(
            model=model,
            args=args,
            train_dataset=load_sft_dataset(base_dir / "sft.jsonl"),
            processing_class=tokenizer,
            callbacks=[capture],
            **extra,
        )
        trainer.train()
        return trainer.state.log_history[0]["loss"], capture.grads

    trl_loss, trl_grads = one_step(SFTTrainer, False)
    ours_loss, ours_grads = one_step(_weighted_loss_trainer_class(), True, prompt_loss_weight=1.0)
    assert ours_loss == pytest.approx(trl_loss, rel=1e-4)
    assert ours_grads.keys() == trl_grads.keys()
    for name, grad in trl_grads.items():
        torch.testing.assert_close(ours_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_sampled_prompt_loss_is_the_weighted_loss_on_average_at_fewer_output_positions(
    base_dir, tmp_path
):
    """sft.prompt_loss_sample < 1: each batch draws its own share of prompt positions, so
    one draw's loss and gradients differ from the full weighted ones, their mean over draws
    is them (unbiased), and the output layer sees the completion plus about that share of
    the prompt."""
    from sqlrl.model.modeling import load_model_and_tokenizer
    from sqlrl.train.sft import _weighted_loss_trainer_class, sft_config

    model, tokenizer = load_model_and_tokenizer(base_dir / "base")
    trainer = _weighted_loss_trainer_class()(
        model=model,
        args=sft_config(_params(), 0, str(tmp_path / "out")),
        train_dataset=load_sft_dataset(base_dir / "sft.jsonl"),
        processing_class=tokenizer,
        prompt_loss_weight=0.1,
        prompt_loss_sample=0.25,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    _, _, weights, is_completion = trainer._weights(batch)
    total_weight = weights.sum()
    positions = []
    model.get_output_embeddings().register_forward_hook(  # ours: (positions, hidden)
        lambda module, args, output: positions.append(args[0].shape[0])
        if args[0].dim() == 2
        else None  # the model's own forward: its last position only (logits_to_keep=1)
    )
    model.train()

    def loss_and_grad():
        model.zero_grad()
        loss = trainer.compute_loss(model, batch, num_items_in_batch=total_weight)
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return loss.item(), grad

    trainer.prompt_loss_sample = 1.0
    full_loss, full_grad = loss_and_grad()
    assert positions.pop() == len(weights)
    trainer.prompt_loss_sample = 0.25
    torch.manual_seed(0)
    draws = [loss_and_grad() for _ in range(400)]
    losses = torch.tensor([loss for loss, _ in draws])
    mean_grad = torch.stack([grad for _, grad in draws]).mean(0)
    assert losses.std() > 0.01 * full_loss  # a draw is not the full loss...
    assert losses.mean().item() == pytest.approx(full_loss, rel=0.02)  # ...their mean is
    assert torch.nn.functional.cosine_similarity(mean_grad, full_grad, dim=0) > 0.99
    assert mean_grad.norm().item() == pytest.approx(full_grad.norm().item(), rel=0.05)
    completion, prompt = int(is_completion.sum()), int((~is_completion).sum())
    mean_positions = sum(positions) / len(positions)
    assert mean_positions == pytest.approx(completion + 0.25 * prompt, rel=0.05)


def test_a_prompt_loss_sample_at_full_weight_still_gets_the_sampling_trainer():
    """prompt_loss_weight 1.0 alone is TRL's own loss; with prompt_loss_sample < 1 the
    sampling trainer must run, or the setting would be silently ignored."""
    from sqlrl.train.sft import _trainer_class, _weighted_loss_trainer_class

    trainer_class, extra = _trainer_class(_params(prompt_loss_weight=1.0, prompt_loss_sample=0.5))
    assert trainer_class.__name__ == _weighted_loss_trainer_class().__name__
    assert extra == {"prompt_loss_weight": 1.0, "prompt_loss_sample": 0.5}


def _varied_rows(path, n=128):
    """SFT rows whose prompts run from a few to ~60 tokens: batches of mixed lengths pad."""
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Answer with SQL."},
                {"role": "user", "content": "singer | id, name " * (1 + (i * 7) % 8) + f"{i}?"},
            ],
            "completion": [
                {"role": "assistant", "content": f"SELECT name FROM singer WHERE id = {i}"}
            ],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow  # ~20-80 s: the fast tier stays a few minutes
def test_padding_is_counted_and_length_grouping_cuts_it(base_dir, tmp_path):
    """metrics/sft.json counts the real tokens and the padding of the batches trained on;
    grouping rows by length trains the same tokens with less padding. (transformers groups
    within mega-batches of up to 50 batches, at least 4 of them: 128 rows give 4 of 32.)"""
    data = _varied_rows(tmp_path / "varied.jsonl")
    runs = {
        grouped: train_sft(
            _params(group_by_length=grouped),
            0,
            base_dir / "base",
            data,
            tmp_path / f"out_{grouped}",
            dvclive_dir=None,
        )
        for grouped in (False, True)
    }
    assert runs[True]["batch_tokens"] == runs[False]["batch_tokens"] == runs[True]["train_tokens"]
    assert runs[True]["padding_tokens"] < runs[False]["padding_tokens"] / 2
    for metrics in runs.values():
        total = metrics["batch_tokens"] + metrics["padding_tokens"]
        assert metrics["padding_share"] == round(metrics["padding_tokens"] / total, 4)


class Interrupted(Exception):
    """Stands for the stage being killed mid-run."""


def _interrupting_progress(at_step: int, steps_run: list):
    """A progress callback that records the steps this run trains and is killed at_step."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step + 1 == at_step:
                raise Interrupted
            steps_run.append(state.global_step + 1)

    return Progress()


def test_an_interrupted_sft_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_run(
    base_dir, tmp_path, monkeypatch
):
    """Killed in step 3 of 3 after checkpoint-2, sft.resume trains only step 3 and saves the
    same model as a run never interrupted; other params start fresh instead."""
    from safetensors.torch import load_file

    import sqlrl.train.sft as sft

    def run(out, at_step=0, **changes):
        steps = []
        monkeypatch.setattr(
            sft, "trainer_progress", lambda name: _interrupting_progress(at_step, steps)
        )
        metrics = train_sft(
            _params(save_steps=1, resume=True, **changes),
            0,
            base_dir / "base",
            base_dir / "sft.jsonl",
            tmp_path / out,
            dvclive_dir=None,
            checkpoint_dir=tmp_path / "ckpt",
        )
        return metrics, steps

    with pytest.raises(Interrupted):
        run("killed", at_step=3)
    assert not (tmp_path / "killed").exists()  # no output that looks complete
    resumed, steps = run("resumed")
    assert resumed["resumed_from"] == "checkpoint-2" and steps == [3]
    fresh, steps = run("other_lr", learning_rate=1e-3)
    assert fresh["resumed_from"] is None and steps == [1, 2, 3]
    (tmp_path / "ckpt").rename(tmp_path / "ckpt_other")
    whole, steps = run("whole")
    assert whole["resumed_from"] is None and steps == [1, 2, 3]
    a = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    b = load_file(str(tmp_path / "whole" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
