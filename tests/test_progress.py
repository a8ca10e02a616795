"""Progress output (sqlrl/progress.py): a bar on a terminal, a line per 5% elsewhere."""

from __future__ import annotations

import io

from sqlrl.progress import Progress, trainer_progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_one_line_per_five_percent_with_an_eta():
    out = io.StringIO()
    with Progress(200, "evaluate dev", unit="ex", file=out) as progress:
        for _ in range(40):
            progress.update(5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 20 and "\r" not in out.getvalue()
    assert lines[0].startswith("evaluate dev:   5% 10/200 [") and "<" in lines[0]
    assert lines[-1].startswith("evaluate dev: 100% 200/200 [")


def test_large_updates_and_a_short_total_still_end_at_100_percent():
    out = io.StringIO()
    with Progress(3, "sft", unit="step", file=out) as progress:
        progress.update(2)
        progress.update(1)
    assert out.getvalue().splitlines()[-1].startswith("sft: 100% 3/3 [")


def test_a_terminal_gets_a_live_bar():
    out = _Terminal()
    with Progress(10, "grpo", unit="step", file=out) as progress:
        progress.update(10)
    assert "\r" in out.getvalue() and "10/10" in out.getvalue()


def test_disabled_progress_prints_nothing():
    out = io.StringIO()
    with Progress(10, "score", file=out, enabled=False) as progress:
        progress.update(10)
    assert out.getvalue() == ""


def test_trainer_callback_counts_optimizer_steps_and_starts_where_a_resumed_run_is():
    from transformers import TrainerControl, TrainerState

    out = io.StringIO()
    callback = trainer_progress("grpo", file=out)
    state = TrainerState(max_steps=40, global_step=20)  # resumed at step 20
    callback.on_train_begin(None, state, TrainerControl())
    for step in range(21, 41):
        state.global_step = step
        callback.on_step_end(None, state, TrainerControl())
    callback.on_train_end(None, state, TrainerControl())
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("grpo:  50% 20/40 [") and lines[-1].startswith("grpo: 100% 40/40 [")
    assert len(lines) == 11  # 50%, 55%, ..., 100%
