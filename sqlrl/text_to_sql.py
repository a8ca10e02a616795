"""A trained model as a Python function, the one thing users do with it:

    from sqlrl.text_to_sql import TextToSQL
    t = TextToSQL("models/final")
    t("How many singers do we have?", db="concert_singer")   # 'SELECT count(*) FROM singer'

Prompts are built from the settings saved with the model (sqlrl_prompt.json, written by the
sft stage), the completion goes through the same SQL extraction and schema repair as
evaluation, and `answer(..., execute=True)` runs the SQL read-only on the Spider database.
The HTTP server (sqlrl/serve) answers the same way, through the same functions (extract_sqls,
answer_from; a test compares them), running each step off its event loop.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlrl.sql.executor import Verdict


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


def extract_sqls(
    texts: list[str], *, schema=None, question: str = "", repair: bool = False
) -> list[str]:
    """The SQL of each completion, as evaluation scores it: extracted from the text, and with
    `repair` and a known schema, names the schema lacks mapped onto names it has."""
    from sqlrl.sql.extract import extract_sql
    from sqlrl.sql.schema_repair import repair_sql

    sqls = [extract_sql(text) for text in texts]
    if repair and schema is not None:
        sqls = [repair_sql(sql, schema, question) for sql in sqls]
    return sqls


def choose(
    sqls: list[str], verdicts: list[Verdict] | None = None
) -> tuple[int, int | None, str | None]:
    """(chosen index, votes, how) over the samples: by execution result when they were run,
    else the most frequent SQL text (the first of a tie); one sample is chosen unvoted."""
    from sqlrl.eval.voting import vote

    if len(sqls) <= 1:
        return 0, None, None
    if verdicts is not None:
        chosen, votes = vote(verdicts)
        return chosen, votes, "execution"
    counts = Counter(sqls)
    votes = max(counts.values())
    return next(i for i, sql in enumerate(sqls) if counts[sql] == votes), votes, "sql_text"


def answer_from(texts: list[str], sqls: list[str], verdicts: list[Verdict] | None) -> Answer:
    """The Answer for completions whose SQL is extracted (and run, when `verdicts`)."""
    if not texts:
        raise ValueError("no completion to answer from")
    chosen, votes, how = choose(sqls, verdicts)
    verdict = verdicts[chosen] if verdicts is not None else None
    return Answer(sqls[chosen], texts[chosen], sqls, votes, how, verdict, chosen)


def finish_answer(
    texts: list[str],
    *,
    schema=None,
    question: str = "",
    repair: bool = False,
    execute: Callable[[list[str]], list[Verdict]] | None = None,
) -> Answer:
    """Model completions -> the answer, as evaluation scores them: the SQL extracted, names
    the schema lacks repaired (when `repair` and the schema is known), and with several
    samples a vote: by execution result when `execute` runs them, else by SQL text. The
    server runs the same steps (extract_sqls, answer_from) with each one off its event loop."""
    sqls = extract_sqls(texts, schema=schema, question=question, repair=repair)
    return answer_from(texts, sqls, execute(sqls) if execute is not None else None)


def default_spider_dir() -> Path:
    """data/raw/spider of the working directory when there is one, else of the checkout this
    package runs from: `TextToSQL(...)` finds the pulled Spider from any folder."""
    here = Path("data/raw/spider")
    if (here / "tables.json").is_file():
        return here
    return Path(__file__).resolve().parent.parent / "data" / "raw" / "spider"


class TextToSQL:
    """Question + (a Spider `db`, a `schema` string or `ddl`) -> SQL, with a trained model."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        spider_dir: str | Path | None = None,  # for db=...; default: default_spider_dir()
        max_new_tokens: int = 128,
        exec_timeout_s: float = 30.0,
        use_vllm: bool = False,
        **prompt_overrides,
    ):
        from sqlrl.data.prompt_settings import PromptSettings
        from sqlrl.model.generate import make_generator
        from sqlrl.prompt_builder import PromptBuilder
        from sqlrl.sql.executor import ExecLimits, SQLExecutor

        self.settings = PromptSettings.for_model(model_dir, **prompt_overrides)
        self.prompts = PromptBuilder(self.settings, spider_dir or default_spider_dir(), local=True)
        self.generator, self.tokenizer = make_generator(
            model_dir,
            use_vllm=use_vllm,
            batch_size=1,
            max_new_tokens=max_new_tokens,
            seed=0,
            progress=False,
        )
        self.executor = SQLExecutor(ExecLimits(timeout_s=exec_timeout_s))

    def databases(self) -> list[str]:
        """The Spider databases `db=` can name (the Spider folder's tables.json)."""
        return sorted(self.prompts.schemas)

    def __call__(
        self,
        question: str,
        db: str | None = None,
        *,
        schema: str | None = None,
        ddl: str | None = None,
    ) -> str:
        """The SQL for `question` (greedy)."""
        return self.answer(question, db, schema=schema, ddl=ddl).sql

    def answer(
        self,
        question: str,
        db: str | None = None,
        *,
        schema: str | None = None,
        ddl: str | None = None,
        execute: bool = False,
        num_samples: int = 1,
        temperature: float = 0.8,
        seed: int = 0,
    ) -> Answer:
        """The full answer; `execute` runs it on `db` (read-only); `num_samples` > 1 samples
        at `temperature` and votes by execution result (with `execute`) or by SQL text."""
        from sqlrl.data.prompts import render_prompt

        given = [
            name
            for name, value in (("db", db), ("schema", schema), ("ddl", ddl))
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(f"give exactly one of db, schema or ddl (got {given or 'none'})")
        if execute and db is None:
            raise ValueError("execute needs a db: only Spider databases can be queried")
        question = unicodedata.normalize("NFC", question).strip()
        db_path = self.prompts.check_db_id(db, need_file=True) if execute else None
        messages = self.prompts.messages(question, schema_str=schema, db_id=db, ddl=ddl)
        prompt = render_prompt(self.tokenizer, messages)
        if num_samples > 1:
            texts = self.generator.sample([prompt], num_samples, temperature, seed)[0]
        else:
            texts = self.generator.generate([prompt])
        known = self.prompts.schema(db_id=db, ddl=ddl) if self.settings.schema_repair else None
        run = (
            (lambda sqls: [self.executor.execute(db_path, sql) for sql in sqls])
            if db_path is not None
            else None
        )
        return finish_answer(
            texts, schema=known, question=question, repair=self.settings.schema_repair, execute=run
        )
