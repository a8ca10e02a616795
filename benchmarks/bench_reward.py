"""Benchmark the execution reward on a GRPO-like batch, against a straightforward version.

    python benchmarks/bench_reward.py [--prompts 256] [--samples 8] [--workers N]

The batch: `prompts` train questions (databases present) x `samples` completions, mixing the
gold query (as written, fenced, or with a trailing `;`), perturbed queries (LIMIT, ORDER BY
direction, literals, dropped WHERE) and broken ones (typos, truncation, unknown columns,
prose). The straightforward version connects per call and executes gold and prediction every
time, serially, with the same extraction and equality. Both run in this process, on the same
batch, and the ratio is printed for the first batch (workers starting) and, as the steady
state of a training run, for further batches of new prompts (median). The process pool, a
thread pool and in-process judging are compared. Then all 1034 dev gold queries are scored
against themselves (the target: well under 30 s with 2 workers on a loaded 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root

from sqlrl.data.rows import recorded_path  # noqa: E402
from sqlrl.eval.score import read_gold, score_predictions  # noqa: E402
from sqlrl.sql.equality import normalize_sql, order_matters, results_match  # noqa: E402
from sqlrl.sql.executor import ExecLimits  # noqa: E402
from sqlrl.sql.extract import extract_sql  # noqa: E402
from sqlrl.sql.judge import default_workers  # noqa: E402
from sqlrl.train.rewards import make_execution_reward  # noqa: E402
from tests.repo_tools import SPIDER_DIR  # noqa: E402


def db_path(db_id: str) -> Path:
    return SPIDER_DIR / "database" / db_id / f"{db_id}.sqlite"


def perturb(sql: str, rng: random.Random) -> str:
    """A plausible wrong answer: one small edit of the gold query."""
    edits = []
    if re.search(r"\bLIMIT\s+\d+", sql, re.I):
        edits.append(
            lambda s: re.sub(r"\bLIMIT\s+(\d+)", lambda m: f"LIMIT {int(m[1]) + 1}", s, flags=re.I)
        )
    if re.search(r"\b(DESC|ASC)\b", sql, re.I):
        edits.append(
            lambda s: re.sub(
                r"\b(DESC|ASC)\b",
                lambda m: "ASC" if m[1].upper() == "DESC" else "DESC",
                s,
                flags=re.I,
            )
        )
    if re.search(r"\b\d+\b", sql):
        edits.append(lambda s: re.sub(r"\b(\d+)\b", lambda m: str(int(m[1]) + 7), s, count=1))
    if re.search(r"\bWHERE\b", sql, re.I):
        edits.append(lambda s: re.split(r"\bWHERE\b", s, flags=re.I)[0])
    edits.append(lambda s: re.sub(r"(?i)^SELECT\s+(DISTINCT\s+)?", "SELECT count(*) , ", s))
    return rng.choice(edits)(sql)


def broken(sql: str, rng: random.Random) -> str:
    """Something that does not run."""
    return rng.choice(
        [
            lambda: sql.replace("SELECT", "SELEC", 1),
            lambda: sql[: max(6, len(sql) // 2)],
            lambda: re.sub(r"(?i)^SELECT\s+", "SELECT no_such_column , ", sql),
            lambda: "I am not sure which table holds this information.",
            lambda: "",
        ]
    )()


def completions_for(sql: str, samples: int, rng: random.Random) -> list[str]:
    """GRPO-like samples: about 40% right (in several wrappings), 35% wrong, 25% broken."""
    out = []
    for _ in range(samples):
        roll = rng.random()
        if roll < 0.4:
            out.append(rng.choice([sql, f"```sql\n{sql}\n```", f"{sql};", f"SQL: {sql}"]))
        elif roll < 0.75:
            out.append(f"```sql\n{perturb(sql, rng)}\n```")
        else:
            out.append(broken(sql, rng))
    return out


def make_batch(examples: list[dict], samples: int, rng: random.Random):
    completions, paths, golds = [], [], []
    for ex in examples:
        for text in completions_for(ex["query"], samples, rng):
            completions.append(text)
            paths.append(recorded_path(db_path(ex["db_id"])))
            golds.append(ex["query"])
    return completions, paths, golds


def straightforward_reward(completions, db_path, gold_sql, timeout_s: float = 5.0):
    """The baseline: connect per call, run gold and prediction every time, one by one."""
    scores = []
    for text, path, gold in zip(completions, db_path, gold_sql, strict=False):
        sql = extract_sql(text)
        conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        deadline = time.monotonic() + timeout_s
        conn.set_progress_handler(lambda d=deadline: time.monotonic() > d, 1000)
        try:
            gold_rows = conn.execute(normalize_sql(gold)).fetchall()
            cursor = conn.execute(normalize_sql(sql))
            if cursor.description is None:  # "" or a comment: nothing ran, nothing to compare
                raise ValueError("not a query")
            pred_rows = cursor.fetchall()
            scores.append(float(results_match(gold_rows, pred_rows, order_matters(gold))))
        except Exception:
            scores.append(0.0)
        finally:
            conn.close()
    return scores


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="steady-state batches")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    train = [
        ex
        for ex in json.loads((SPIDER_DIR / "train_spider.json").read_text())
        if db_path(ex["db_id"]).is_file()
    ]
    rng.shuffle(train)
    batches = [
        make_batch(train[k * args.prompts : (k + 1) * args.prompts], args.samples, rng)
        for k in range(1 + args.repeats)
    ]
    first = batches[0]
    print(
        f"batch: {args.prompts} prompts x {args.samples} samples = {len(first[0])} completions, "
        f"{len(set(zip(first[1], first[2], map(extract_sql, first[0]), strict=False)))} distinct items; "
        f"workers={args.workers}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )

    variants = {
        "process pool": make_execution_reward(ExecLimits(timeout_s=5.0), workers=args.workers),
        "thread pool": make_execution_reward(
            ExecLimits(timeout_s=5.0), workers=args.workers, backend="thread"
        ),
        "in-process": make_execution_reward(ExecLimits(timeout_s=5.0), workers=1),
    }
    baseline, base_s = timed(straightforward_reward, *first)
    for name, reward in variants.items():
        scores, seconds = timed(reward, first[0], db_path=first[1], gold_sql=first[2])
        assert scores == baseline, f"{name} and the straightforward reward disagree"
        print(
            f"first batch, {name:12s}: {seconds:.3f} s vs {base_s:.3f} s straightforward "
            f"-> {base_s / seconds:.1f}x (includes starting workers)"
        )
    # Steady state of a training run: new prompts every step, workers already running.
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    for batch in batches[1:]:
        baseline, base_s = timed(straightforward_reward, *batch)
        for name, reward in variants.items():
            scores, seconds = timed(reward, batch[0], db_path=batch[1], gold_sql=batch[2])
            assert scores == baseline, f"{name} and the straightforward reward disagree"
            ratios[name].append(base_s / seconds)
        print(
            f"next batch: straightforward {base_s:.3f} s, mean reward "
            f"{sum(baseline) / len(baseline):.3f}"
        )
    for name, values in ratios.items():
        print(
            f"steady state, {name:12s}: median {statistics.median(values):.1f}x faster "
            f"(per batch: {', '.join(f'{v:.1f}' for v in values)})"
        )
    for reward in variants.values():
        reward.pool.close()

    gold = read_gold(SPIDER_DIR / "dev_gold.sql")
    report, dev_s = timed(
        score_predictions,
        gold,
        [sql for sql, _ in gold],
        SPIDER_DIR / "database",
        SPIDER_DIR / "tables.json",
        workers=args.workers,
        progress=False,
    )
    print(
        f"dev gold vs gold, {len(gold)} items (EX, EM, hardness; pool start included): "
        f"{dev_s:.2f} s; ex={report['ex']} em={report['em']} n={report['n']} "
        f"skipped={report['skipped']}"
    )


if __name__ == "__main__":
    main()
