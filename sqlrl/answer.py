"""The one answer path: a model's completions -> the SQL it answers with.

    extract the SQL (sqlrl.sql.extract) -> schema repair (names the database lacks mapped
    onto its own, when on and the schema is known) -> with several samples, a vote

The vote is by execution result when the candidates were run (candidates whose results are
equal as the benchmark's EX compares them form a group; the first of the largest group wins:
`vote`), else by SQL text. Evaluation (sqlrl.eval.evaluate, greedy and maj@k),
`TextToSQL.answer` and the HTTP server all answer through here, so a served answer is the one
evaluation scored: evaluation and TextToSQL call `finish_answer`; the server calls its two
steps, `candidate_sqls` and `answer_from`, because it runs them on different threads (repair
in its CPU pool, execution off the event loop). Nothing here imports FastAPI or torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlrl.benchmarks.base import Benchmark
from sqlrl.benchmarks.spider import SPIDER
from sqlrl.sql.executor import Verdict

Repair = Callable[[str], str]  # one candidate's SQL -> its repaired SQL


@dataclass
class Answer:
    """The chosen SQL with how it was chosen; `verdict` when it was executed."""

    sql: str
    completion: str  # the model's text the SQL was taken from
    candidates: list[str] = field(default_factory=list)  # every sample's SQL, in order
    votes: int | None = None  # with several samples: the size of the winning group
    vote: str | None = None  # "execution" (by result) or "sql_text"
    verdict: Verdict | None = None
    chosen: int = 0  # the index of the chosen sample in `candidates`
    extracted: str = ""  # the chosen SQL as extracted, before schema repair
    trace: dict | None = None  # agent format: the chosen episode's probes and final SQL
    # constrained decoding asked for (TextToSQL): whether the samples were decoded under the
    # schema's grammar, and why not (a schema string, a schema without a grammar); else None
    constrained: bool | None = None
    unconstrained_reason: str | None = None


def schema_repair(schema, question: str) -> Repair | None:
    """The repair of one question's candidates against its database's `schema` (None when
    the schema is unknown: free-text schemas have no names to check against)."""
    if schema is None:
        return None
    from sqlrl.sql.schema_repair import repair_sql

    return lambda sql: repair_sql(sql, schema, question)


def candidate_sqls(
    texts: list[str], repair: Repair | None = None, extract: Callable[[str], str] | None = None
) -> tuple[list[str], list[str]]:
    """(the SQL of each completion as it is answered and scored, the same before repair).
    `extract`: the model's format's extractor (sqlrl.formats' Format.extract; default the
    `sql` format's extract_sql)."""
    from sqlrl.sql.extract import extract_sql

    extracted = [(extract or extract_sql)(text) for text in texts]
    return ([repair(sql) for sql in extracted] if repair else list(extracted)), extracted


def vote(verdicts, benchmark: Benchmark = SPIDER) -> tuple[int, int]:
    """(index of the chosen candidate, its votes) from the candidates' execution verdicts.

    Candidates whose results are equal as the benchmark's EX judges results
    (`benchmark.same_result`; Spider's: rows as a multiset, columns in any order; BIRD's: rows
    as a set) form a group; the first member of the largest group wins, the group seen first
    on ties. (0, 0) when no candidate ran. Self-consistency in evaluation
    (sqlrl.eval.voting) votes through here too, so served and scored answers vote alike.
    """
    groups: list[list[int]] = []
    for i, verdict in enumerate(verdicts):
        if verdict.status != "ok":
            continue
        for members in groups:
            if benchmark.same_result(verdicts[members[0]].rows, verdict.rows):
                members.append(i)
                break
        else:
            groups.append([i])
    if not groups:
        return 0, 0
    best = max(groups, key=len)  # max keeps the first of equals: the group seen first
    return best[0], len(best)


def choose(
    sqls: list[str], verdicts: list[Verdict] | None = None, benchmark: Benchmark = SPIDER
) -> tuple[int, int | None, str | None]:
    """(chosen index, votes, how) over the samples: by execution result (grouped by the
    `benchmark`'s equality) when they were run, else the most frequent SQL text (the first of
    a tie); one sample is chosen unvoted."""
    if len(sqls) <= 1:
        return 0, None, None
    if verdicts is not None:
        chosen, votes = vote(verdicts, benchmark)
        return chosen, votes, "execution"
    counts = Counter(sqls)
    votes = max(counts.values())
    return next(i for i, sql in enumerate(sqls) if counts[sql] == votes), votes, "sql_text"


def answer_from(
    texts: list[str],
    sqls: list[str],
    verdicts: list[Verdict] | None,
    benchmark: Benchmark = SPIDER,
    extracted: list[str] | None = None,
) -> Answer:
    """The Answer for completions whose SQL is taken (candidate_sqls), and run when
    `verdicts` are given."""
    if not texts:
        raise ValueError("no completion to answer from")
    chosen, votes, how = choose(sqls, verdicts, benchmark)
    verdict = verdicts[chosen] if verdicts is not None else None
    before = (extracted or sqls)[chosen]
    return Answer(sqls[chosen], texts[chosen], sqls, votes, how, verdict, chosen, before)


def finish_answer(
    texts: list[str],
    *,
    repair: Repair | None = None,
    execute: Callable[[list[str]], list[Verdict]] | None = None,
    benchmark: Benchmark = SPIDER,
    extract: Callable[[str], str] | None = None,
) -> Answer:
    """Model completions -> the answer: the SQL extracted (by the format's `extract`),
    `repair`ed, and with several samples a vote, by execution result when `execute` runs
    them, else by SQL text."""
    sqls, extracted = candidate_sqls(texts, repair, extract)
    verdicts = execute(sqls) if execute is not None else None
    return answer_from(texts, sqls, verdicts, benchmark, extracted)
