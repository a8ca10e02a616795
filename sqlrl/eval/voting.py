"""Self-consistency (`eval.num_samples` > 1): of N sampled queries per question, answer with
one from the largest group of candidates that return the same result, as in SQL-R1 and OmniSQL
(results compared the way EX compares them). Candidates that fail to execute get no vote."""

from __future__ import annotations

from collections.abc import Callable


def vote(verdicts, rules: str = "spider") -> tuple[int, int]:
    """(index of the chosen candidate, its votes) from the candidates' execution verdicts.

    Candidates whose results are equal as the benchmark's EX judges results (Spider,
    sqlrl.sql.equality: rows as a multiset, columns in any order; BIRD: rows as a set) form a
    group; the first member of the largest group wins, the group seen first on ties. (0, 0)
    when no candidate ran.
    """
    from sqlrl.sql.equality import results_match
    from sqlrl.sql.judge import bird_results_match

    def same(a, b) -> bool:
        return bird_results_match(a, b) if rules == "bird" else results_match(a, b, ordered=False)

    groups: list[list[int]] = []
    for i, verdict in enumerate(verdicts):
        if verdict.status != "ok":
            continue
        for members in groups:
            if same(verdicts[members[0]].rows, verdict.rows):
                members.append(i)
                break
        else:
            groups.append([i])
    if not groups:
        return 0, 0
    best = max(groups, key=len)  # max keeps the first of equals: the group seen first
    return best[0], len(best)


def vote_answers(
    samples: list[list[str]],
    db_paths: list[str],
    executor=None,
    fix: Callable[[int, str], str] | None = None,
    rules: str = "spider",
    extract: Callable[[str], str] | None = None,
) -> list:
    """Each question's Answer (sqlrl.answer) from its N sampled texts, every candidate run
    read-only on its database; `fix(question index, sql)` rewrites each candidate before it
    runs (schema repair); `extract`: the model's format's extractor (default extract_sql)."""
    from sqlrl.answer import finish_answer
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
                rules=rules,
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
    rules: str = "spider",
) -> tuple[list[str], list[int], list[str]]:
    """(chosen SQL, votes, chosen raw text) per question from N sampled texts each (see
    vote_answers)."""
    answers = vote_answers(samples, db_paths, executor, fix, rules)
    return [a.sql for a in answers], [votes_of(a) for a in answers], [a.completion for a in answers]
