"""The execution reward for GRPO, usable directly as a TRL `GRPOTrainer` reward function.

`execution_reward(completions, db_path, gold_sql, **kwargs)` gives 1.0 when the SQL extracted
from a completion returns the gold result (sqlrl.equality semantics), else 0.0, and None when
the example's database file is absent: TRL reads None as "not scorable" (the sample gets no
advantage) instead of a silent 0. `syntax_reward` gives 1.0 to SQL that executes; weight it in
with grpo.reward_weights.syntax (e.g. 0.1). Neither ever raises.

A batch is judged in a persistent pool of worker processes, each with its own read-only
connections and gold cache. Identical (database, gold, prediction) items in a batch are judged
once, and items are handed out grouped by database so connections and gold results are reused.
Processes, not threads: SQLite releases the GIL while stepping, but the time-limit handler and
fetching and comparing rows are Python, so threads contend (see benchmarks/bench_reward.py).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from sqlrl.equality import normalize_sql, order_matters, results_match
from sqlrl.executor import ExecLimits, SQLExecutor
from sqlrl.paths import resolve
from sqlrl.sql_extract import extract_sql

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

    With `shortcuts` (rewards), work that cannot change the verdict is skipped: a prediction
    whose SQL is the gold SQL reuses the gold result, and a prediction's rows stop being read
    once there are more than the gold result has. Reports leave them off, so that every item
    carries its prediction's own execution status.
    """

    def __init__(
        self, limits: ExecLimits | None = None, keep_distinct: bool = False, shortcuts: bool = False
    ):
        self.executor = SQLExecutor(limits)
        self.keep_distinct = keep_distinct
        self.shortcuts = shortcuts

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
                stop = len(gold.rows) if self.shortcuts and gold.ok else None
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
            match = results_match(gold.rows, pred.rows, order_matters(gold_sql))
            return Judgement("ok", "ok", match, "" if match else "result differs", trivial)
        except Exception as exc:
            return Judgement("error", "error", False, f"internal: {type(exc).__name__}: {exc}")

    def _normalize(self, sql):
        """DISTINCT handling and operator joining; oversized text goes on to be refused."""
        if isinstance(sql, str) and len(sql) <= self.executor.limits.max_sql_chars:
            return normalize_sql(sql, self.keep_distinct)
        return sql


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


def _init_worker(limits: ExecLimits, keep_distinct: bool, shortcuts: bool) -> None:
    """Pool initializer: one Judge per worker process (or thread), kept across batches."""
    _worker.judge = Judge(limits, keep_distinct, shortcuts)


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
    With `workers` <= 1, or a small batch, items are judged in this process. `shortcuts`:
    see `Judge`.
    """

    def __init__(
        self,
        limits: ExecLimits | None = None,
        workers: int | None = None,
        keep_distinct: bool = False,
        backend: str = "process",
        shortcuts: bool = False,
    ):
        if backend not in ("process", "thread"):
            raise ValueError(f"backend must be 'process' or 'thread', got {backend!r}")
        self.limits = limits or ExecLimits()
        self.workers = default_workers() if workers is None else int(workers)
        self.keep_distinct = keep_distinct
        self.backend = backend
        self.shortcuts = shortcuts
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
            args = (self.limits, self.keep_distinct, self.shortcuts)
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
            self._inline = Judge(self.limits, self.keep_distinct, self.shortcuts)
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


def _column(values, n: int) -> list:
    """A dataset column as a list of n values; a single value stands for all n."""
    if isinstance(values, (str, os.PathLike)) or not isinstance(values, Sequence):
        return [values] * n
    return list(values)


def _items(completions, db_path, gold_sql, repair=None) -> list[Item]:
    """(database, gold, predicted SQL) per completion; `repair(i, sql)` rewrites the SQL."""
    n = len(completions)
    paths, golds = _column(db_path, n), _column(gold_sql, n)
    if len(paths) != n or len(golds) != n:
        raise ValueError(f"{n} completions but {len(paths)} db_path and {len(golds)} gold_sql")
    absolute: dict = {}  # a batch repeats each path num_generations times
    for p in paths:
        if p not in absolute:
            absolute[p] = str(resolve(p))
    sqls = [_each(extract_sql, c) for c in completions]
    if repair is not None:
        sqls = [_each(repair, i, sql) for i, sql in enumerate(sqls)]
    return [(absolute[p], g, s) for s, p, g in zip(sqls, paths, golds, strict=False)]


def _each(fn, *args) -> str:
    """fn(*args) for one completion; if it fails, that completion's SQL is empty (it scores
    0) rather than the batch failing, which would score every completion in it 0."""
    try:
        return fn(*args)
    except Exception as exc:
        log.warning(
            "reward: %s failed on one completion: %s: %s",
            getattr(fn, "__name__", fn),
            type(exc).__name__,
            exc,
        )
        return ""


def _schema_repairer(schemas: dict, n: int, kwargs: dict):
    """repair(i, sql) for a batch, from its db_id and question columns."""
    from sqlrl.schema_repair import repairer

    if kwargs.get("db_id") is None or kwargs.get("question") is None:
        raise ValueError("schema repair needs the db_id and question columns")
    return repairer(schemas, _column(kwargs["db_id"], n), _column(kwargs["question"], n))


class _Rewards:
    """The state shared by one pair of reward functions: the pool and running counts."""

    def __init__(self, pool: JudgePool, schemas: dict | None = None):
        self.pool = pool
        self.schemas = schemas  # db_id -> Schema: reward the schema-repaired SQL
        self.stats: Counter = Counter()  # judgement statuses over all execution_reward calls
        self._warned: set[str] = set()

    def judge(self, completions, db_path, gold_sql, kwargs: dict) -> list[Judgement] | None:
        """Judgements for a batch, or None when the batch itself is unusable (logged)."""
        try:
            repair = (
                _schema_repairer(self.schemas, len(completions), kwargs) if self.schemas else None
            )
            return self.pool.judge_many(_items(completions, db_path, gold_sql, repair))
        except Exception as exc:
            log.error("reward batch could not be judged: %s: %s", type(exc).__name__, exc)
            return None

    def record(self, judgements: list[Judgement], log_metric) -> None:
        """Count statuses, warn once per absent database, and log shares to the trainer."""
        batch = Counter(j.status for j in judgements)
        self.stats.update(batch)
        for j in judgements:
            if j.status == "skipped" and j.error not in self._warned:
                self._warned.add(j.error)
                log.warning("execution reward: %s (reward None: not scorable)", j.error)
        if callable(log_metric) and judgements:
            for status in ("error", "timeout", "skipped"):
                try:
                    log_metric(f"execution/{status}_frac", batch[status] / len(judgements))
                except Exception:
                    pass


def _count(completions) -> int:
    try:
        return len(completions)
    except TypeError:
        return 0


def make_rewards(
    limits: ExecLimits | None = None,
    workers: int | None = None,
    keep_distinct: bool = False,
    backend: str = "process",
    schemas: dict | None = None,
    executable_credit: float = 0.0,
):
    """(execution_reward, syntax_reward) sharing one judge pool; see the module docstring.
    With `schemas` (db_id -> Schema), the SQL is schema-repaired before it is judged, using
    the batch's db_id and question columns (grpo.schema_repair). `executable_credit` is the
    execution reward of SQL that runs but returns the wrong result (Arctic-Text2SQL-R1: 0.1)."""
    if not 0.0 <= executable_credit < 1.0:
        raise ValueError(f"executable_credit must be in [0, 1), got {executable_credit}")
    state = _Rewards(JudgePool(limits, workers, keep_distinct, backend, shortcuts=True), schemas)

    def execution_reward(completions, db_path, gold_sql, **kwargs) -> list[float | None]:
        """1.0 if the completion's SQL returns the gold result, `executable_credit` if it
        runs, else 0.0; None if the database is absent."""
        judgements = state.judge(completions, db_path, gold_sql, kwargs)
        if judgements is None:
            return [0.0] * _count(completions)
        state.record(judgements, kwargs.get("log_metric"))
        return [
            None
            if j.status == "skipped"
            else 1.0
            if j.match
            else executable_credit
            if j.pred_status == "ok"
            else 0.0
            for j in judgements
        ]

    def syntax_reward(completions, db_path, gold_sql=None, **kwargs) -> list[float | None]:
        """1.0 if the completion's SQL executes (any result), 0.0 if not, None if the
        database is absent."""
        judgements = state.judge(completions, db_path, "" if gold_sql is None else gold_sql, kwargs)
        if judgements is None:
            return [0.0] * _count(completions)
        return [
            None if "skipped" in (j.pred_status, j.gold_status) else float(j.pred_status == "ok")
            for j in judgements
        ]

    for fn in (execution_reward, syntax_reward):
        fn.pool = state.pool
        fn.stats = state.stats
    return execution_reward, syntax_reward


def make_execution_reward(
    limits: ExecLimits | None = None,
    workers: int | None = None,
    keep_distinct: bool = False,
    backend: str = "process",
):
    """An `execution_reward` with its own limits and pool (TRL logs it as execution_reward)."""
    return make_rewards(limits, workers, keep_distinct, backend)[0]


# Module-level defaults (5 s limit, one pool started on first use), for TRL and scripts.
execution_reward, syntax_reward = make_rewards()
