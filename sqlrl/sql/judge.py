"""The EX judge: run the gold and the predicted SQL on the same database and compare results.

One `Judge` per process; `JudgePool` judges batches in persistent worker processes, each with
its own read-only connections and gold cache. Identical (database, gold, prediction) items in
a batch are judged once, and items are handed out grouped by database so connections and gold
results are reused. Processes, not threads: SQLite releases the GIL while stepping, but the
time-limit handler and fetching and comparing rows are Python, so threads contend (see
benchmarks/bench_reward.py). Evaluation, scoring and the GRPO reward all judge here.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import threading
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from sqlrl.benchmarks.base import Benchmark
from sqlrl.benchmarks.spider import SPIDER
from sqlrl.sql.executor import ExecLimits, SQLExecutor

log = logging.getLogger(__name__)

Item = tuple[str, str, str]  # (absolute database path, gold SQL, predicted SQL)
_MIN_PARALLEL = 32  # smaller batches are judged in-process: IPC would cost more
_CHUNKS_PER_WORKER = 8  # enough pieces to balance slow queries across workers
_RECENT = 16_384  # judgements remembered, so the syntax reward reuses them


@dataclass(frozen=True)
class Judgement:
    """How one prediction fared against its gold query."""

    pred_status: str  # the prediction's verdict: ok | error | timeout | skipped
    gold_status: str  # the gold query's verdict
    match: bool  # both ran and the results are equal
    error: str = ""  # why not, in a few words
    gold_trivial: bool = False  # the gold result is empty or only 0/NULL: any query that
    # returns nothing (or zero) "matches" it (see trivial_result)
    soft_f1: float | None = None  # both queries ran: the benchmark's partial credit (BIRD's
    # Soft-F1), None where it gives none

    @property
    def status(self) -> str:
        """One status for reports: skipped (database absent), the prediction's, or 'error'
        when only the gold query failed."""
        if "skipped" in (self.gold_status, self.pred_status):
            return "skipped"
        if self.pred_status != "ok":
            return self.pred_status
        return "ok" if self.gold_status == "ok" else "error"


class Judge:
    """Executes gold (cached) and prediction on one database and compares the results.

    `benchmark` (sqlrl.benchmarks) gives the rule: how both queries are run (Spider
    normalises DISTINCT as its evaluator does, BIRD runs the SQL as written) and when two
    results are equal (Spider: test-suite EX; BIRD: sets of rows, with Soft-F1). Spider's
    unless told: the rewards judge by it.

    With `shortcuts` (rewards), work that cannot change the verdict is skipped: a prediction
    whose SQL is the gold SQL reuses the gold result, and a prediction's rows stop being read
    once there are more than the gold result has. Reports leave them off, so that every item
    carries its prediction's own execution status.
    """

    def __init__(
        self,
        limits: ExecLimits | None = None,
        keep_distinct: bool = False,
        shortcuts: bool = False,
        benchmark: Benchmark = SPIDER,
    ):
        self.executor = SQLExecutor(limits)
        self.keep_distinct = keep_distinct
        self.shortcuts = shortcuts
        self.benchmark = benchmark

    def judge(self, db_path: str, gold_sql: str, pred_sql: str) -> Judgement:
        """Never raises: an internal failure is an 'error' judgement."""
        try:
            gold = self.executor.execute_gold(db_path, self._normalize(gold_sql))
            if gold.status == "skipped":
                return Judgement("skipped", "skipped", False, gold.error)
            pred_sql = self._normalize(pred_sql)
            if self.shortcuts and gold.ok and _same_text(pred_sql, self._normalize(gold_sql)):
                pred = gold
            else:
                # where more rows than the gold result can still be equal to it (BIRD's
                # sets), every row is read
                early = self.shortcuts and gold.ok and self.benchmark.stops_early
                stop = len(gold.rows) if early else None
                pred = self.executor.execute(db_path, pred_sql, stop_after=stop)
            trivial = gold.ok and trivial_result(gold.rows)
            if pred.status != "ok":
                return Judgement(pred.status, gold.status, False, pred.error, trivial)
            if gold.status != "ok":
                return Judgement(
                    "ok", gold.status, False, f"gold query {gold.status}: {gold.error}"
                )
            if pred.truncated:
                return Judgement("ok", "ok", False, "more rows than the gold result", trivial)
            match, f1 = self.benchmark.compare(gold.rows, pred.rows, gold_sql)
            why = "" if match else "result differs"
            return Judgement("ok", "ok", match, why, trivial, soft_f1=f1)
        except Exception as exc:
            return Judgement("error", "error", False, f"internal: {type(exc).__name__}: {exc}")

    def _normalize(self, sql):
        """The SQL as the benchmark runs it (Spider's DISTINCT handling and operator joining;
        BIRD's as written)."""
        return self.benchmark.prepare_sql(
            sql, self.keep_distinct, self.executor.limits.max_sql_chars
        )


def trivial_result(rows) -> bool:
    """No rows, or only 0, NULL and empty strings: many wrong queries return that too (in
    Spider dev, 8% of the gold results, e.g. flight_2's empty joins), so an EX match on such a
    question says little."""
    return all(value in (0, None, "") for row in rows for value in row)


def _same_text(a, b) -> bool:
    """The same SQL text, up to surrounding whitespace and a trailing `;`."""
    return (
        isinstance(a, str)
        and isinstance(b, str)
        and a.strip().rstrip("; \t\r\n") == b.strip().rstrip("; \t\r\n")
    )


_worker = threading.local()


def _init_worker(
    limits: ExecLimits, keep_distinct: bool, shortcuts: bool, benchmark: Benchmark
) -> None:
    """Pool initializer: one Judge per worker process (or thread), kept across batches (the
    benchmark object pickles into a spawned worker, so a family registered at run time
    judges there too)."""
    _worker.judge = Judge(limits, keep_distinct, shortcuts, benchmark)


def _judge_chunk(chunk: list[Item]) -> list[Judgement]:
    judge = _worker.judge
    return [judge.judge(*item) for item in chunk]


def default_workers() -> int:
    """Worker count: this process's share of the cores (each training process on the machine
    has its own pool), at most 8 (SQLite work on Spider is light)."""
    from sqlrl.hardware import cores_per_process

    return max(1, min(8, cores_per_process()))


class JudgePool:
    """Judges batches of items in parallel, in workers that persist across calls.

    `backend` is "process" (spawned processes, safe after CUDA is initialised) or "thread".
    With `workers` <= 1, or a small batch, items are judged in this process. `shortcuts`
    and `benchmark`: see `Judge`.
    """

    def __init__(
        self,
        limits: ExecLimits | None = None,
        workers: int | None = None,
        keep_distinct: bool = False,
        backend: str = "process",
        shortcuts: bool = False,
        benchmark: Benchmark = SPIDER,
    ):
        if backend not in ("process", "thread"):
            raise ValueError(f"backend must be 'process' or 'thread', got {backend!r}")
        self.limits = limits or ExecLimits()
        self.workers = default_workers() if workers is None else int(workers)
        self.keep_distinct = keep_distinct
        self.backend = backend
        self.shortcuts = shortcuts
        self.benchmark = benchmark
        self._pool: Executor | None = None
        self._inline: Judge | None = None
        self._recent: OrderedDict[Item, Judgement] = OrderedDict()
        self._lock = threading.Lock()

    def judge_many(
        self, items: Sequence[Item], progress: Callable[[int], None] | None = None
    ) -> list[Judgement]:
        """One judgement per item, in order. `progress(k)` is told as k more items finish."""
        with self._lock:
            counts = Counter(items)
            done = {item: self._recent[item] for item in counts if item in self._recent}
            if progress and done:
                progress(sum(counts[item] for item in done))
            todo = [item for item in counts if item not in done]
            done.update(self._judge_unique(todo, counts, progress))
            for item in todo:
                self._remember(item, done[item])
            return [done[item] for item in items]

    def close(self) -> None:
        """Stop the workers (a later call starts new ones)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _judge_unique(self, todo: list[Item], counts: Counter, progress) -> dict[Item, Judgement]:
        results: dict[Item, Judgement] = {}
        if self.workers > 1 and len(todo) >= _MIN_PARALLEL:
            try:
                pool = self._get_pool()
                futures = {
                    pool.submit(_judge_chunk, chunk): chunk for chunk in _chunks(todo, self.workers)
                }
                for future in as_completed(futures):
                    chunk = futures[future]
                    results.update(zip(chunk, future.result(), strict=False))
                    if progress:
                        progress(sum(counts[item] for item in chunk))
            except Exception as exc:  # a dead worker (OOM-killed...): finish here, restart later
                log.warning(
                    "judge pool failed (%s: %s); judging in-process", type(exc).__name__, exc
                )
                try:
                    self.close()
                except Exception:
                    self._pool = None
        judge = self._inline_judge()
        for item in todo:
            if item not in results:
                results[item] = judge.judge(*item)
                if progress:
                    progress(counts[item])
        return results

    def _get_pool(self) -> Executor:
        if self._pool is None:
            args = (self.limits, self.keep_distinct, self.shortcuts, self.benchmark)
            if self.backend == "thread":
                self._pool = ThreadPoolExecutor(
                    self.workers, initializer=_init_worker, initargs=args
                )
            else:
                self._pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker,
                    initargs=args,
                )
        return self._pool

    def _inline_judge(self) -> Judge:
        if self._inline is None:
            self._inline = Judge(self.limits, self.keep_distinct, self.shortcuts, self.benchmark)
        return self._inline

    def _remember(self, item: Item, judgement: Judgement) -> None:
        self._recent[item] = judgement
        if len(self._recent) > _RECENT:
            self._recent.popitem(last=False)


def _chunks(items: list[Item], workers: int) -> list[list[Item]]:
    """Small pieces for the workers, each holding whole (database, gold) groups.

    A group (one prompt's samples) stays in one piece so its gold query runs once. Groups are
    spread in a fixed pseudo-random order rather than by database: the heavy queries of a
    training batch tend to share a database, and one worker holding them all would hold up
    the batch.
    """
    groups: dict[tuple[str, str], list[Item]] = {}
    for item in items:
        groups.setdefault((item[0], item[1]), []).append(item)
    ordered = sorted(groups.values(), key=lambda g: zlib.crc32(repr(g[0][:2]).encode()))
    size = max(4, math.ceil(len(items) / (workers * _CHUNKS_PER_WORKER)))
    chunks: list[list[Item]] = [[]]
    for group in ordered:
        if len(chunks[-1]) >= size:
            chunks.append([])
        chunks[-1].extend(group)
    return chunks
