"""GRPO prompt selection (what published text-to-SQL RL found useful), before training:
- drop prompts whose gold result is empty (every wrong query that returns nothing would be
  rewarded as right);
- optionally keep only prompts the SFT model solves sometimes but not always (pass-rate filter):
  a group whose samples all get the same reward has zero advantage and teaches nothing.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from sqlrl.params import GrpoParams

ROW_KEYS = ("prompt", "gold_sql", "db_id", "question", "db_path")  # a GRPO row: prepare writes them


@dataclass
class SelectionStats:
    candidates: int = 0
    dropped_gold_error: int = 0
    dropped_empty_gold: int = 0
    pass_rate_pool: int = 0
    dropped_always_solved: int = 0
    dropped_never_solved: int = 0
    kept: int = 0
    pass_rates: list[float] = field(default_factory=list)

    def as_metrics(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "pass_rates"}
        if self.pass_rates:
            out["pool_mean_pass_rate"] = round(statistics.fmean(self.pass_rates), 4)
        return out


def drop_empty_gold(rows: list[dict], executor, stats: SelectionStats) -> list[dict]:
    """Rows whose gold SQL runs and returns something other than nothing or only 0/NULL
    (`sqlrl.sql.judge.trivial_result`): many wrong queries return that too, and would be
    rewarded for it."""
    from sqlrl.sql.judge import trivial_result

    kept = []
    for row in rows:
        verdict = executor.execute_gold(row["db_path"], row["gold_sql"])
        if verdict.status != "ok":
            stats.dropped_gold_error += 1
        elif trivial_result(verdict.rows):
            stats.dropped_empty_gold += 1
        else:
            kept.append(row)
    return kept


def pass_rate_filter(
    rows: list[dict], rates: list[float], min_rate: float, max_rate: float, stats: SelectionStats
) -> list[dict]:
    """Rows whose sampled pass rate lies in [min_rate, max_rate]."""
    kept = []
    for row, rate in zip(rows, rates, strict=False):
        if rate > max_rate:
            stats.dropped_always_solved += 1
        elif rate < min_rate:
            stats.dropped_never_solved += 1
        else:
            kept.append(row)
    return kept


def sampled_pass_rates(
    rows: list[dict], generator, tokenizer, samples: int, temperature: float, seed: int, reward_fn
) -> list[float]:
    """Share of `samples` completions per prompt that the execution reward scores 1 (solved;
    partial credit for a query that merely runs does not count)."""
    from sqlrl.data.prompts import render_prompt

    prompts = [render_prompt(tokenizer, row["prompt"]) for row in rows]
    groups = generator.sample(prompts, samples, temperature, seed)
    rates = []
    for row, group in zip(rows, groups, strict=False):
        columns = {k: [v] * len(group) for k, v in row.items() if k != "prompt"}
        rewards = reward_fn(group, **columns)  # the row's columns, as TRL passes them
        rates.append(sum(r == 1.0 for r in rewards) / len(rewards))
    return rates


def select_prompts(
    rows: list[dict], params: GrpoParams, seed: int, executor, sample_pass_rates=None
) -> tuple[list[dict], SelectionStats]:
    """The GRPO training prompts, in a seeded order, and what the filters did.

    `sample_pass_rates(rows) -> list[float]` measures the SFT model's pass rates; it is only
    called when the pass-rate filter is on (grpo.pass_rate_filter.pool > 0).
    """
    stats = SelectionStats(candidates=len(rows))
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    if params.drop_empty_gold:
        rows = drop_empty_gold(rows, executor, stats)
    filt = params.pass_rate_filter
    if filt.pool > 0:
        pool = rows[: filt.pool]
        stats.pass_rate_pool = len(pool)
        stats.pass_rates = sample_pass_rates(pool)
        rows = pass_rate_filter(pool, stats.pass_rates, filt.min_rate, filt.max_rate, stats)
    stats.kept = len(rows)
    if not rows:
        raise ValueError(f"GRPO prompt selection kept no prompt: {stats.as_metrics()}")
    return rows, stats
