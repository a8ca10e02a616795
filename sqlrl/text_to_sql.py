"""A trained model as a Python function, the one thing users do with it:

    from sqlrl.text_to_sql import TextToSQL
    t = TextToSQL("models/final")
    t("How many singers do we have?", db="concert_singer")   # 'SELECT count(*) FROM singer'

Prompts are built from the settings saved with the model (sqlrl_prompt.json, written by the
sft stage), the completions go through the answer path evaluation and the HTTP server share
(sqlrl.answer: extraction, schema repair, vote; a test compares the three), and
`answer(..., execute=True)` runs the SQL read-only on the Spider database.

The model is asked in the answer format its folder records (docs/rollouts.md): `reasoning`
gets its system prompt and only its final <answer> is read; `agent` runs the tool loop
evaluation runs (sqlrl/agent.py) on the `db` (a `schema` or `ddl` question has no database
to probe), and the Answer's `trace` holds its probes, their observations and the final SQL.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

from sqlrl.answer import Answer, finish_answer, schema_repair

__all__ = ["Answer", "TextToSQL", "default_spider_dir"]


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
        self.agent = None
        if self.settings.rollout == "agent":
            from sqlrl.agent import AgentLoop

            self.agent = AgentLoop(self.generator, self.tokenizer, self.settings.answer_format)

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
        at `temperature` and votes by execution result (with `execute`) or by SQL text. An
        agent model's answer carries its `trace`."""
        from sqlrl.params import check_sampling
        from sqlrl.train.rollouts import EXTRACTORS

        check_sampling(num_samples, temperature, "num_samples", "temperature")
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
        decode = dict(n=num_samples, temperature=temperature if num_samples > 1 else 0.0)
        if self.agent is not None:
            episodes = self._episodes(messages, db, seed=seed, **decode)
            texts = [episode.answer or "" for episode in episodes]
        else:
            texts = self._completions(messages, seed=seed, **decode)
        known = self.prompts.schema(db_id=db, ddl=ddl) if self.settings.schema_repair else None
        run = (
            (lambda sqls: [self.executor.execute(db_path, sql) for sql in sqls])
            if db_path is not None
            else None
        )
        rollout = self.settings.rollout
        answer = finish_answer(
            texts,
            repair=schema_repair(known, question),
            execute=run,
            extract=EXTRACTORS[rollout] if rollout != "sql" else None,
        )
        if self.agent is not None:
            answer.trace = episodes[answer.chosen].trace(answer.sql)
        return answer

    def _completions(self, messages, *, n: int, temperature: float, seed: int) -> list[str]:
        """The model's completions of one prompt: greedy, or n samples."""
        from sqlrl.data.prompts import render_prompt

        prompt = render_prompt(self.tokenizer, messages)
        if n > 1:
            return self.generator.sample([prompt], n, temperature, seed)[0]
        return self.generator.generate([prompt])

    def _episodes(self, messages, db: str | None, *, n: int, temperature: float, seed: int):
        """An agent model's episodes for one question, its tool on `db` where the file is."""
        path = self.prompts.check_db_id(db, need_file=False) if db is not None else None
        tool_db = str(path) if path is not None and path.is_file() else None
        return self.agent.run([messages], [tool_db], n=n, temperature=temperature, seed=seed)[0]
