"""The run's wall clock: phases ask what is left before they start, and an alarm at its end
stops whatever runs, so that the report is written inside the machine's time limit."""

from __future__ import annotations

import signal
import time


class Budget:
    """The run's wall clock: phases ask what is left before they start, and an alarm at the
    end stops whatever is running, so the run ends (its report written) inside the limit of
    the machine's command instead of being killed with it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def arm(self) -> None:
        def spent(signum, frame):
            raise SystemExit(f"the run's budget of {self.seconds:g} s is spent")

        signal.signal(signal.SIGALRM, spent)
        if self.left() > 0:  # else every phase is skipped: nothing to stop
            signal.setitimer(signal.ITIMER_REAL, self.left())

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
