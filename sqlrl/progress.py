"""Progress a person can read: a tqdm bar with an ETA on a terminal; elsewhere (a DVC run in
CI, a log file) one plain line per `every` share of the work, so a slow machine shows in the
first minute, not after an hour."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

LINE_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"


class Progress:
    """Counts work done out of `total`; a bar on a terminal, a line per `every` share elsewhere."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "it",
        every: float = 0.05,
        file=None,
        enabled: bool = True,
    ):
        self.total, self.desc, self.unit = max(int(total), 0), desc, unit
        self.file = file if file is not None else sys.stderr
        self.n = 0
        self.enabled = enabled
        self.terminal = enabled and self.file.isatty()
        self.bar = (
            tqdm(total=self.total, desc=desc, unit=unit, file=self.file, dynamic_ncols=True)
            if self.terminal
            else None
        )
        self.step = max(1, round(self.total * every))
        self.next_line = self.step
        self.start = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and (self.n >= self.next_line or self.n == self.total):
            while self.next_line <= self.n:
                self.next_line += self.step
            self._line()

    def _line(self) -> None:
        elapsed = time.perf_counter() - self.start
        text = tqdm.format_meter(
            self.n, self.total, elapsed, prefix=self.desc, unit=self.unit, bar_format=LINE_FORMAT
        )
        print(text, file=self.file, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def trainer_progress(desc: str, file=None):
    """A transformers TrainerCallback showing optimizer steps as a Progress (main process only)."""
    from transformers import TrainerCallback

    class TrainerProgress(TrainerCallback):
        def __init__(self):
            self.progress: Progress | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                self.progress = Progress(state.max_steps, desc, unit="step", file=file)
                self.progress.update(state.global_step)  # a resumed run starts part-way

        def on_step_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(state.global_step - self.progress.n)

        def on_train_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.close()
                self.progress = None

    return TrainerProgress()
