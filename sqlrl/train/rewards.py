"""The execution reward for GRPO, usable directly as a TRL `GRPOTrainer` reward function.

`execution_reward(completions, db_path, gold_sql, **kwargs)` gives 1.0 when the SQL extracted
from a completion returns the gold result (sqlrl.sql.equality semantics), else 0.0, and None when
the example's database file is absent: TRL reads None as "not scorable" (the sample gets no
advantage) instead of a silent 0. `syntax_reward` gives 1.0 to SQL that executes; weight it in
with grpo.reward_weights.syntax (e.g. 0.1); `format_reward` pays for the reasoning rollout's
<think>/<answer> shape. None ever raises.

Rewards are chosen by name (sqlrl/reward_names.py's `REWARDS`, the one registry: name -> its
builder here; grpo.reward_weights maps names to weights), or as a user's
`package.module:function` (`resolve_reward`). Importing this module builds nothing: a run's
rewards are built by `reward_registry` (or `make_rewards`), and the module-level
`execution_reward`/`syntax_reward` (defaults: 5 s limit) on first use. Building them starts no
worker pool either: the judge's workers start with the first batch it judges.

A batch is judged by the EX judge's pool of worker processes (sqlrl/sql/judge.py), the same
judge evaluation scores with; this module adapts it to TRL's reward-function signature.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from sqlrl.data.spider import load_schemas
from sqlrl.errors import PipelineError
from sqlrl.formats import get_format
from sqlrl.formats.reasoning import reasoning_format_score
from sqlrl.reward_names import REWARDS
from sqlrl.sql.executor import ExecLimits
from sqlrl.sql.extract import extract_sql
from sqlrl.sql.judge import Item, Judgement, JudgePool

log = logging.getLogger(__name__)


def _column(values, n: int) -> list:
    """A dataset column as a list of n values; a single value stands for all n."""
    if isinstance(values, (str, os.PathLike)) or not isinstance(values, Sequence):
        return [values] * n
    return list(values)


def _items(completions, db_path, gold_sql, repair=None, extract=extract_sql) -> list[Item]:
    """(database, gold, predicted SQL) per completion, its SQL read by `extract` (the
    rollout's Format's, sqlrl/formats/); `repair(i, sql)` rewrites the SQL."""
    n = len(completions)
    paths, golds = _column(db_path, n), _column(gold_sql, n)
    if len(paths) != n or len(golds) != n:
        raise ValueError(f"{n} completions but {len(paths)} db_path and {len(golds)} gold_sql")
    absolute: dict = {}  # a batch repeats each path num_generations times
    for p in paths:
        if p not in absolute:
            absolute[p] = os.path.abspath(p)
    sqls = [_each(extract, c) for c in completions]
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
    from sqlrl.sql.schema_repair import repairer

    if kwargs.get("db_id") is None or kwargs.get("question") is None:
        raise ValueError("schema repair needs the db_id and question columns")
    return repairer(schemas, _column(kwargs["db_id"], n), _column(kwargs["question"], n))


class _Rewards:
    """The state one run's reward functions share (what their builders get): the judge's
    pool, how the SQL is read and repaired, the executable credit, and running counts."""

    def __init__(
        self,
        pool: JudgePool,
        schemas: dict | None = None,
        extract=extract_sql,
        executable_credit: float = 0.0,
    ):
        self.pool = pool
        self.schemas = schemas  # db_id -> Schema: reward the schema-repaired SQL
        self.extract = extract  # completion -> SQL, as the rollout format says
        self.executable_credit = executable_credit
        self.last_without_sql = 0  # completions of the last batch with no SQL (no answer)
        self.stats: Counter = Counter()  # judgement statuses over all execution_reward calls
        self._warned: set[str] = set()

    def judge(self, completions, db_path, gold_sql, kwargs: dict) -> list[Judgement] | None:
        """Judgements for a batch, or None when the batch itself is unusable (logged)."""
        try:
            repair = (
                _schema_repairer(self.schemas, len(completions), kwargs) if self.schemas else None
            )
            items = _items(completions, db_path, gold_sql, repair, self.extract)
            self.last_without_sql = sum(not sql for _, _, sql in items)
            return self.pool.judge_many(items)
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


def _shares_the_pool(fn, state: _Rewards):
    """`fn` with its state's pool and counts as attributes (closed, counted by grpo)."""
    fn.pool = state.pool
    fn.stats = state.stats
    return fn


# --------------------------------------------------------------------------- builders
# One per name of sqlrl/reward_names.py's REWARDS: builder(state) -> the reward function.


def build_execution_reward(state: _Rewards):
    """`execution_reward`: the completion's SQL judged against the gold query."""
    executable_credit = state.executable_credit

    def execution_reward(completions, db_path, gold_sql, **kwargs) -> list[float | None]:
        """1.0 if the completion's SQL returns the gold result, `executable_credit` if it
        runs, else 0.0; None if the database is absent."""
        judgements = state.judge(completions, db_path, gold_sql, kwargs)
        if judgements is None:
            return [0.0] * _count(completions)
        state.record(judgements, kwargs.get("log_metric"))
        state.stats["without_sql"] += state.last_without_sql  # no final answer, no SQL at all
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

    return _shares_the_pool(execution_reward, state)


def build_syntax_reward(state: _Rewards):
    """`syntax_reward`: whether the completion's SQL executes."""

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

    return _shares_the_pool(syntax_reward, state)


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 for a completion shaped as the reasoning rollout asks (<think>...</think> then
    <answer>...</answer> and nothing after), else 0.0; it reads no database."""
    return [reasoning_format_score(c) for c in completions]


def build_format_reward(state: _Rewards):
    """`format_reward`: it judges nothing, so it is the same function for every run."""
    return format_reward


def make_rewards(
    limits: ExecLimits | None = None,
    workers: int | None = None,
    keep_distinct: bool = False,
    backend: str = "process",
    schemas: dict | None = None,
    executable_credit: float = 0.0,
    extract=extract_sql,
):
    """(execution_reward, syntax_reward) sharing one judge pool; see the module docstring.
    `extract(completion) -> SQL` reads the answer (the rollout format's extractor).
    With `schemas` (db_id -> Schema), the SQL is schema-repaired before it is judged, using
    the batch's db_id and question columns (grpo.schema_repair). `executable_credit` is the
    execution reward of SQL that runs but returns the wrong result (Arctic-Text2SQL-R1: 0.1;
    its range is checked where params load: grpo.executable_credit)."""
    pool = JudgePool(limits, workers, keep_distinct, backend, shortcuts=True)
    state = _Rewards(pool, schemas, extract, executable_credit)
    return build_execution_reward(state), build_syntax_reward(state)


def make_execution_reward(
    limits: ExecLimits | None = None,
    workers: int | None = None,
    keep_distinct: bool = False,
    backend: str = "process",
):
    """An `execution_reward` with its own limits and pool (TRL logs it as execution_reward)."""
    return make_rewards(limits, workers, keep_distinct, backend)[0]


@functools.cache
def _defaults() -> dict:
    """The registry at default settings (5 s limit, one pool started on first use), built on
    first use: the module-level `execution_reward`/`syntax_reward` and `resolve_reward`'s."""
    state = _Rewards(JudgePool(shortcuts=True))
    return {name: _imported(path)(state) for name, path in REWARDS.items()}


def __getattr__(name: str):
    """`execution_reward` and `syntax_reward` at default settings, for TRL and scripts
    (docs/sandbox.md), built when first asked for rather than when the module is imported."""
    if name in ("execution_reward", "syntax_reward"):
        return _defaults()[name.removesuffix("_reward")]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RewardError(PipelineError, ValueError):
    """A reward named in grpo.reward_weights cannot be used."""


def resolve_reward(name: str, registry: dict | None = None):
    """The reward called `name`: a registry name, or `package.module:function` imported from
    the Python path (a user's own reward, called as TRL calls every reward function)."""
    registry = _defaults() if registry is None else registry
    if name in registry:
        return registry[name]
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise RewardError(
            f"grpo.reward_weights: unknown reward {name!r}: one of {', '.join(registry)}, "
            "or package.module:function"
        )
    return _imported(name)


def _imported(path: str):
    """The function at `package.module:function`: a user's reward, or a registry entry's
    builder (sqlrl/reward_names.py names this module's)."""
    module_name, _, attribute = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # ImportError, AttributeError, or the module's own failure
        raise RewardError(
            f"grpo.reward_weights: cannot import reward {path!r}: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(fn):
        raise RewardError(
            f"grpo.reward_weights: reward {path!r} is a {type(fn).__name__}, not a function"
        )
    return fn


def reward_registry(params, spider_dir: str | Path, rollout: str | None = None) -> dict:
    """name -> reward function, configured as grpo params (GrpoParams) say: the limits,
    schema repair, executable credit and the rollout's extractor (`rollout` overrides
    params.rollout: the pass-rate filter of an agent run samples without tools). The same in
    prompt selection and in training, so a prompt's pass rate is measured by the reward it
    is trained on. Schema repair reads the schemas from spider_dir/tables.json."""
    schemas = load_schemas(Path(spider_dir) / "tables.json") if params.schema_repair else None
    state = _Rewards(
        JudgePool(ExecLimits(timeout_s=params.reward_timeout_s), shortcuts=True),
        schemas,
        get_format(rollout or params.rollout).extract,
        params.executable_credit,
    )
    return {name: _imported(path)(state) for name, path in REWARDS.items()}


def reward_functions(params, spider_dir: str | Path) -> list:
    """The rewards grpo.reward_weights names, in its order (TRL's reward_weights:
    `reward_weight_list`)."""
    registry = reward_registry(params, spider_dir)
    return [resolve_reward(name, registry) for name in params.reward_weights]


def reward_weight_list(params) -> list[float]:
    """grpo.reward_weights' weights, in the order of `reward_functions`."""
    return [float(w) for w in params.reward_weights.values()]
