"""The agent rollout's environment: TRL's `environment_factory` gets `environment_factory(...)`.

TRL 1.16 builds one `SQLEnvironment` per rollout (pooled across batches), calls
`reset(**row)` with the dataset row before generating, and exposes every public method other
than `reset` as a tool, its schema read from the signature and docstring. TRL runs the tool
loop (parse the <tool_call>, call the method, append the tool message, generate again, mask the
tool result out of the loss); nothing here generates.

`execute_sql` runs the model's query in the sandbox the reward judges with
(sqlrl/sql/executor.py: read-only by three locks, time, heap, row and byte bounds, never
raising), on the row's own database and with the reward's time limit, and answers with a
bounded text observation: the column names, the first `max_rows` rows and how many there are,
or the error; at most `max_chars` characters. At most `max_turns` calls an episode; later ones
are answered with an error observation (TRL also stops after max_tool_calling_iterations).

Every environment runs its queries through its thread's executor
(sqlrl.sql.executor.default_executor, the one the server's /execute uses), not one of its own:
SQLite's heap limit is process-wide and each open connection holds about 100 KB of it plus
page-cache pages only it can recycle, while TRL keeps one environment per rollout alive (128 a
GPU at the reference settings) and evaluation one per episode of a split; an executor each ran
the heap out within a few hundred episodes, and from then on every call answered
`error: ... MemoryError`. One executor per thread also needs no lock.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlrl.sql.executor import ExecLimits, default_executor

_CUT = " ... [cut at {n} characters]"


@dataclass
class EpisodeStats:
    """What one environment saw over its episodes (summed into the GRPO metrics)."""

    episodes: int = 0
    calls: int = 0
    failed_calls: int = 0  # error, timeout, refused or over the turn limit


class SQLEnvironment:
    """One rollout's database and its execute_sql tool. Built with no arguments by TRL: use
    `environment_factory` to bind the bounds."""

    def __init__(
        self,
        limits: ExecLimits | None = None,
        max_turns: int = 5,
        max_rows: int = 10,
        max_chars: int = 1000,
        stats: EpisodeStats | None = None,
    ):
        self.limits = limits or ExecLimits()
        self.max_turns = max_turns
        self.max_rows = max_rows
        self.max_chars = max_chars
        self.stats = stats if stats is not None else EpisodeStats()  # shared by a factory's
        self.db_path: str | None = None
        self.turns = 0

    def reset(self, db_path=None, **row) -> None:
        """Bind to the row's database and start a new episode; the prompt is left as is."""
        self.db_path = db_path
        self.turns = 0
        self.stats.episodes += 1

    def execute_sql(self, query: str) -> str:
        """Run a read-only SQLite query on the question's database and see its result.

        Args:
            query: One SQLite SELECT statement.

        Returns:
            The column names, the first rows and the number of rows, or the error.
        """
        self.turns += 1
        self.stats.calls += 1
        if self.turns > self.max_turns:
            return self._failed(f"no more queries: at most {self.max_turns} per question")
        if not self.db_path:
            return self._failed("no database for this question")
        verdict = default_executor(self.limits).execute(self.db_path, query)
        if not verdict.ok:
            return self._failed(verdict.error or verdict.status)
        return self._bounded(self._table(verdict.columns, verdict.rows))

    def _failed(self, reason: str) -> str:
        self.stats.failed_calls += 1
        return self._bounded(f"error: {reason}")

    def _table(self, columns, rows) -> str:
        """The row count first (a cut never hides it), the column names, then rows while
        they fit: each value cut to max_chars before it is joined, so a wide result costs
        no more than the observation shows."""
        shown = rows[: self.max_rows]
        count = f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
        if len(shown) < len(rows):
            count += f", first {len(shown)} shown"
        lines = [f"({count})", self._line(columns)]
        size = sum(map(len, lines))
        for row in shown:
            if size > self.max_chars:
                break
            lines.append(self._line("NULL" if v is None else v for v in row))
            size += len(lines[-1]) + 1
        return "\n".join(lines)

    def _line(self, values) -> str:
        return " | ".join(str(v)[: self.max_chars] for v in values)[: self.max_chars + 1]

    def _bounded(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        cut = _CUT.format(n=self.max_chars)
        return text[: self.max_chars - len(cut)] + cut


def environment_factory(
    limits: ExecLimits, max_turns: int, max_rows: int, max_chars: int
) -> tuple[functools.partial, EpisodeStats]:
    """(factory, stats): what TRL's `environment_factory=` takes (called with no arguments,
    one instance per rollout), and the counts every instance it builds adds to."""
    stats = EpisodeStats()
    factory = functools.partial(
        SQLEnvironment,
        limits=limits,
        max_turns=max_turns,
        max_rows=max_rows,
        max_chars=max_chars,
        stats=stats,
    )
    return factory, stats


def tool_schemas() -> list[dict]:
    """The JSON schemas of SQLEnvironment's tools, as TRL 1.16 finds and renders them for the
    agent rollout (every public function of the class but `reset` and `get_reward`, in name
    order, through transformers' get_json_schema): SFT rows in the agent format carry them, so
    SFT shows the model the tool list GRPO prompts with, byte for byte
    (tests/formats/test_trajectories.py renders both)."""
    import inspect

    from transformers.utils import get_json_schema

    env = SQLEnvironment()
    return [
        get_json_schema(getattr(env, name))
        for name, _ in inspect.getmembers(SQLEnvironment, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]
