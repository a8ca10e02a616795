"""Self-consistency (`eval.num_samples` > 1): of N sampled queries per question, answer with
one from the largest group of candidates that return the same result, as in SQL-R1 and OmniSQL
(results compared the way EX compares them). Candidates that fail to execute get no vote.
The vote itself is the answer path's (sqlrl.answer.vote), grouping by the benchmark's
equality; here are evaluation's batches of it."""

from __future__ import annotations

from collections.abc import Callable

from sqlrl.answer import finish_answer
from sqlrl.benchmarks.base import Benchmark
from sqlrl.benchmarks.spider import SPIDER


def vote_answers(
    samples: list[list[str]],
    db_paths: list[str],
    executor=None,
    fix: Callable[[int, str], str] | None = None,
    benchmark: Benchmark = SPIDER,
    extract: Callable[[str], str] | None = None,
) -> list:
    """Each question's Answer (sqlrl.answer) from its N sampled texts, every candidate run
    read-only on its database; `fix(question index, sql)` rewrites each candidate before it
    runs (schema repair); `extract`: the model's format's extractor (default extract_sql)."""
    from sqlrl.eval.score import EVAL_TIMEOUT_S
    from sqlrl.sql.executor import ExecLimits, SQLExecutor

    # a candidate runs under the limit its score will, so a vote never counts a query that
    # scoring then times out (or drops one that scoring would have judged)
    executor = executor or SQLExecutor(ExecLimits(timeout_s=EVAL_TIMEOUT_S))
    answers = []
    for q, (candidates, db_path) in enumerate(zip(samples, db_paths, strict=True)):
        answers.append(
            finish_answer(
                candidates,
                repair=(lambda sql, q=q: fix(q, sql)) if fix is not None else None,
                execute=lambda sqls, path=db_path: [executor.execute(path, sql) for sql in sqls],
                benchmark=benchmark,
                extract=extract,
            )
        )
    return answers


def votes_of(answer) -> int:
    """The winning group's size; a lone candidate is a group of one when it ran, else 0."""
    if answer.votes is not None:
        return answer.votes
    return int(answer.verdict is not None and answer.verdict.status == "ok")


def self_consistency(
    samples: list[list[str]],
    db_paths: list[str],
    executor=None,
    fix: Callable[[int, str], str] | None = None,
    benchmark: Benchmark = SPIDER,
) -> tuple[list[str], list[int], list[str]]:
    """(chosen SQL, votes, chosen raw text) per question from N sampled texts each (see
    vote_answers)."""
    answers = vote_answers(samples, db_paths, executor, fix, benchmark)
    return [a.sql for a in answers], [votes_of(a) for a in answers], [a.completion for a in answers]
