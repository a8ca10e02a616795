"""The EX judge: run the gold and the predicted SQL on the same database and compare results.

One `Judge` per process; `JudgePool` judges batches in persistent worker processes, each with
its own read-only connections and gold cache. Identical (database, gold, prediction) items in
a batch are judged once, and items are handed out grouped by database so connections and gold
results are reused. Processes, not threads: SQLite releases the GIL while stepping, but the
time-limit handler and fetching and comparing rows are Python, so threads contend (see
tests/benchmarks/bench_reward.py). Evaluation, scoring and the GRPO reward all judge here.
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

from sqlrl.sql.equality import normalize_sql, order_matters, results_match
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
    soft_f1: float | None = None  # BIRD semantics, both queries ran: bird_soft_f1 of the rows

    @property
    def status(self) -> str:
        """One status for reports: skipped (database absent), the prediction's, or 'error'
        when only the gold query failed."""
        if "skipped" in (self.gold_status, self.pred_status):
            return "skipped"
        if self.pred_status != "ok":
            return self.pred_status
        return "ok" if self.gold_status == "ok" else "error"


SEMANTICS = ("spider", "bird")


def bird_results_match(gold_rows, pred_rows) -> bool:
    """BIRD's official EX (its evaluation_ex.py): the two results as sets of rows, so row
    order and duplicate rows do not count, column order does."""
    return set(gold_rows) == set(pred_rows)


def bird_soft_f1(gold_rows, pred_rows) -> float:
    """BIRD mini_dev's Soft-F1 (its evaluation_f1.py), partial credit where EX gives none.

    Duplicate rows are dropped (first occurrence kept) and the i-th predicted row is paired
    with the i-th gold row, so unlike BIRD's EX, row order counts. In a pair, each predicted
    value found in the gold row is matched, each one not found is predicted-only, and each
    gold value not in the predicted row is gold-only, all divided by the gold row's width; a
    gold row without a partner is 1 gold-only, a predicted row without one 1 predicted-only.
    F1 of precision matched / (matched + predicted-only) and recall matched / (matched +
    gold-only); two empty results score 1.
    """
    gold = list(dict.fromkeys(gold_rows))
    pred = list(dict.fromkeys(pred_rows))
    if not gold and not pred:
        return 1.0
    matched = pred_only = gold_only = 0.0
    for gold_row, pred_row in zip(gold, pred, strict=False):
        width = len(gold_row)
        matched += sum(value in gold_row for value in pred_row) / width
        pred_only += sum(value not in gold_row for value in pred_row) / width
        gold_only += sum(value not in pred_row for value in gold_row) / width
    gold_only += max(0, len(gold) - len(pred))
    pred_only += max(0, len(pred) - len(gold))
    precision = matched / (matched + pred_only) if matched + pred_only else 0.0
    recall = matched / (matched + gold_only) if matched + gold_only else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


class Judge:
    """Executes gold (cached) and prediction on one database and compares the results.

    `semantics` picks the benchmark's rule: "spider" (test-suite EX: rows as a multiset, in
    order when the gold query sorts, columns in any order, DISTINCT normalised as Spider's
    evaluator does) or "bird" (the SQL runs as written; results compared as sets).

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
        semantics: str = "spider",
    ):
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
        self.executor = SQLExecutor(limits)
        self.keep_distinct = keep_distinct
        self.shortcuts = shortcuts
        self.semantics = semantics

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
                # BIRD's sets: more rows than the gold result can still be equal to it
                early = self.shortcuts and gold.ok and self.semantics == "spider"
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
            if self.semantics == "bird":
                match = bird_results_match(gold.rows, pred.rows)
                f1 = bird_soft_f1(gold.rows, pred.rows)
            else:
                match, f1 = results_match(gold.rows, pred.rows, order_matters(gold_sql)), None
            why = "" if match else "result differs"
            return Judgement("ok", "ok", match, why, trivial, soft_f1=f1)
        except Exception as exc:
            return Judgement("error", "error", False, f"internal: {type(exc).__name__}: {exc}")

    def _normalize(self, sql):
        """DISTINCT handling and operator joining (Spider's rule; BIRD runs the SQL as
        written); oversized text goes on to be refused."""
        if self.semantics == "bird":
            return sql
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


def _init_worker(limits: ExecLimits, keep_distinct: bool, shortcuts: bool, semantics: str) -> None:
    """Pool initializer: one Judge per worker process (or thread), kept across batches."""
    _worker.judge = Judge(limits, keep_distinct, shortcuts, semantics)


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
    and `semantics`: see `Judge`.
    """

    def __init__(
        self,
        limits: ExecLimits | None = None,
        workers: int | None = None,
        keep_distinct: bool = False,
        backend: str = "process",
        shortcuts: bool = False,
        semantics: str = "spider",
    ):
        if backend not in ("process", "thread"):
            raise ValueError(f"backend must be 'process' or 'thread', got {backend!r}")
        self.limits = limits or ExecLimits()
        self.workers = default_workers() if workers is None else int(workers)
        self.keep_distinct = keep_distinct
        self.backend = backend
        self.shortcuts = shortcuts
        self.semantics = semantics
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
            args = (self.limits, self.keep_distinct, self.shortcuts, self.semantics)
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
            self._inline = Judge(self.limits, self.keep_distinct, self.shortcuts, self.semantics)
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
