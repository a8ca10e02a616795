"""GRPO resume (grpo.resume): a run interrupted after a checkpoint continues from it when
nothing it computes from changed, and starts fresh when its params, seed, prompts or SFT
model did. The tiny model and real train questions of tests/train/conftest.py."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from sqlrl.train.checkpoints import FINGERPRINT_FILE, checkpoint_to_resume, last_checkpoint
from sqlrl.train.grpo import grpo_fingerprint as run_fingerprint
from sqlrl.train.grpo import train_grpo
from sqlrl.train.rewards import reward_functions
from tests.repo_tools import SPIDER_DIR, fixed_params


class Interrupted(Exception):
    """Stands for the stage being killed mid-run."""


def _params(**changes):
    settings = dict(
        steps=4, batch_size=4, num_generations=2, max_completion_length=8, save_steps=1, resume=True
    )
    return dataclasses.replace(fixed_params().grpo, **{**settings, **changes})


def _counting(rewards, calls: list, interrupt_at: int | None = None) -> list:
    """`rewards` with the execution reward counting its calls (one per step here), and
    raising Interrupted at call `interrupt_at`."""
    execution, *others = rewards

    def execution_reward(completions, **kwargs):
        calls.append(len(completions))
        if len(calls) == interrupt_at:
            raise Interrupted
        return execution(completions, **kwargs)

    return [execution_reward, *others]


def _train(tmp_path, rewards, sft_dir, params=None, seed=0, prompts=None):
    return train_grpo(
        params or _params(),
        seed,
        sft_dir,
        prompts,
        tmp_path / "adapter",
        rewards,
        checkpoint_dir=tmp_path / "ckpt",
        dvclive_dir=str(tmp_path / "dvclive"),
    )


def _steps_logged(tmp_path) -> list[int]:
    """The steps of the reward curve DVCLive wrote (what `dvc plots` draws)."""
    header, *lines = (tmp_path / "dvclive/plots/metrics/reward.tsv").read_text().splitlines()
    step = header.split("\t").index("step")
    return [int(line.split("\t")[step]) for line in lines]


def test_an_interrupted_run_resumes_from_its_checkpoint(rows, tiny_sft, tmp_path):
    rewards = reward_functions(_params(), SPIDER_DIR)
    calls: list[int] = []
    with pytest.raises(Interrupted):  # killed in step 3, after checkpoint-2
        _train(tmp_path, _counting(rewards, calls, interrupt_at=3), tiny_sft, prompts=rows[:4])
    assert last_checkpoint(tmp_path / "ckpt") == str(tmp_path / "ckpt" / "checkpoint-2")
    assert not (tmp_path / "adapter").exists()  # no output that looks complete
    assert _steps_logged(tmp_path) == [0, 1]

    calls.clear()
    metrics = _train(tmp_path, _counting(rewards, calls), tiny_sft, prompts=rows[:4])
    assert metrics["resumed_from"] == "checkpoint-2"
    assert metrics["steps"] == 4 and len(calls) == 2  # steps 3 and 4: 1 and 2 are not redone
    assert metrics["logged_steps"] == 4  # the summary covers the whole run
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert _steps_logged(tmp_path) == [0, 1, 2, 3]  # the curve continues, one point a step


def _retrained(sft_dir, tmp_path):
    """A copy of the SFT model with one weight changed, as a new SFT run would leave it."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "sft_again"
    shutil.copytree(sft_dir, copy)
    weights = load_file(copy / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 0.01
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


@pytest.mark.slow  # ~20-80 s: the fast tier stays a few minutes
def test_a_changed_sft_model_starts_fresh_ignoring_the_checkpoint(rows, tiny_sft, tmp_path, caplog):
    """After SFT is retrained, continuing the old run would train an adapter for the old
    model: the checkpoint is set aside and all the steps run."""
    rewards = reward_functions(_params(), SPIDER_DIR)
    calls: list[int] = []
    with pytest.raises(Interrupted):
        _train(tmp_path, _counting(rewards, calls, interrupt_at=3), tiny_sft, prompts=rows[:4])
    caplog.clear()

    calls.clear()
    retrained = _retrained(tiny_sft, tmp_path)
    metrics = _train(tmp_path, _counting(rewards, calls), retrained, prompts=rows[:4])
    assert metrics["resumed_from"] is None
    assert metrics["steps"] == 4 and len(calls) == 4
    assert _steps_logged(tmp_path) == [0, 1, 2, 3]  # a new curve, not the old one continued
    assert "not resuming from" in caplog.text
    fingerprint = json.loads((tmp_path / "ckpt" / FINGERPRINT_FILE).read_text())["fingerprint"]
    assert fingerprint == run_fingerprint(_params(), 0, retrained, rows[:4])


# What a run computes from, changed: the checkpoint is another run's
CHANGES = {
    "params": lambda run: dict(run, params=_params(learning_rate=1e-3)),
    "seed": lambda run: dict(run, seed=run["seed"] + 1),
    "prompts": lambda run: dict(run, rows=run["rows"][1:]),
    "a prompt's gold SQL": lambda run: dict(
        run, rows=[dict(run["rows"][0], gold_sql=run["rows"][1]["gold_sql"]), *run["rows"][1:]]
    ),
}
# Settings that do not change what it computes (turning resume on after a run without it
# first of all): the checkpoint is still this run's
UNCHANGED = {
    "resume": lambda run: dict(run, params=_params(resume=False)),
    "checkpoint interval": lambda run: dict(run, params=_params(save_steps=5)),
    "log interval": lambda run: dict(run, params=_params(logging_steps=5)),
}


@pytest.fixture
def checkpointed(rows, tiny_sft, tmp_path):
    """A checkpoint folder as a run interrupted after step 1 leaves it, and that run."""
    run = dict(params=_params(), seed=0, sft_dir=tiny_sft, rows=rows[:4])
    (tmp_path / "checkpoint-1").mkdir()
    fingerprint = run_fingerprint(**run)
    (tmp_path / FINGERPRINT_FILE).write_text(json.dumps({"fingerprint": fingerprint}))
    return tmp_path, run


@pytest.mark.parametrize("change", CHANGES)
def test_a_run_that_computes_from_something_else_does_not_resume(change, checkpointed, caplog):
    folder, run = checkpointed
    assert checkpoint_to_resume(folder, run_fingerprint(**run)) == str(folder / "checkpoint-1")
    assert checkpoint_to_resume(folder, run_fingerprint(**CHANGES[change](run))) is None
    assert f"not resuming from {folder / 'checkpoint-1'}" in caplog.text


@pytest.mark.parametrize("change", UNCHANGED)
def test_settings_that_do_not_change_the_result_keep_the_checkpoint(change, checkpointed):
    folder, run = checkpointed
    resumed = checkpoint_to_resume(folder, run_fingerprint(**UNCHANGED[change](run)))
    assert resumed == str(folder / "checkpoint-1")


@pytest.mark.parametrize(
    "save_steps, interrupt_at, checkpoint",
    [(2, 4, "checkpoint-2"), (1, 2, "checkpoint-1")],
    ids=["killed between checkpoints", "killed after the first step"],
)
@pytest.mark.slow  # ~20-80 s: the fast tier stays a few minutes
def test_the_resumed_curve_has_one_point_a_step(
    rows, tiny_sft, tmp_path, save_steps, interrupt_at, checkpoint
):
    """Steps after the checkpoint are redone; their points must replace the ones logged before
    the kill, not follow them (DVCLive alone continued from its own last point: [0, 1, 2, 3,
    4] for 4 steps, or [0, 0, 1] when killed after the first)."""
    params = _params(save_steps=save_steps)
    rewards = reward_functions(params, SPIDER_DIR)
    calls: list[int] = []
    with pytest.raises(Interrupted):
        _train(
            tmp_path, _counting(rewards, calls, interrupt_at), tiny_sft, params, prompts=rows[:4]
        )
    assert _steps_logged(tmp_path) == list(range(interrupt_at - 1))
    metrics = _train(tmp_path, rewards, tiny_sft, params, prompts=rows[:4])
    assert metrics["resumed_from"] == checkpoint
    assert _steps_logged(tmp_path) == [0, 1, 2, 3]
