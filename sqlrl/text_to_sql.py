"""A trained model as a Python function, the one thing users do with it:

    from sqlrl.text_to_sql import TextToSQL
    t = TextToSQL("models/final")
    t("How many singers do we have?", db="concert_singer")   # 'SELECT count(*) FROM singer'

Prompts are built from the settings saved with the model (sqlrl_prompt.json, written by the
sft stage), the completions go through the answer path evaluation and the HTTP server share
(sqlrl.answer: extraction, schema repair, vote; a test compares the three), and
`answer(..., execute=True)` runs the SQL read-only on the Spider database.

The model is asked in the answer format its folder records (docs/rollouts.md), through the
format's own inference loop and extractor (sqlrl/formats/), as evaluation asks it:
`reasoning` gets its system prompt and only its final <answer> is read; `agent` runs the tool
loop on the `db` (a `schema` or `ddl` question has no database to probe), and the Answer's
`trace` holds its probes, their observations and the final SQL.

Your own database: `TextToSQL(model, database="postgresql://reader@host/shop")` (or
`"sqlite:///path/file.sqlite"`) introspects it into the prompt the model was trained on and
makes it the default of every call (`t("How many orders?")`; its name, `t.database`, is the
URL's database or file name, with `_live` added where a Spider database has that name);
`answer(..., execute=True)` runs the SQL read-only and bounded, transpiled to PostgreSQL
(sqlrl/live/databases.py; the verdict's `executed_sql` is what ran). `refresh()` reads its
schema again.

Schema-constrained decoding (docs/grammar.md): `TextToSQL(model, constrained=True)`, or
`t(question, db=..., constrained=True)` for one call, decodes the answer under its schema's
grammar (a `db`, or `ddl`), so it names only that database's tables and columns; a `schema`
string has no parsed names and decodes unconstrained. The Answer says which
(`constrained`, and `unconstrained_reason`). The `sql` answer format only: a reasoning or agent
model is refused (ConstrainedFormatError), as evaluation refuses it.
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
        constrained: bool = False,  # the default of every call's `constrained`
        database: str | None = None,  # a live database's URL: postgresql://... or sqlite:///...
        max_rows: int = 1000,  # rows a live database's answer returns at most
        **prompt_overrides,
    ):
        from sqlrl.data.prompt_settings import PromptSettings
        from sqlrl.formats import get_format
        from sqlrl.model.generate import make_generator
        from sqlrl.request_input import RequestInput, check_constrained_format
        from sqlrl.sql.executor import ExecLimits, SQLExecutor

        self.settings = PromptSettings.for_model(model_dir, **prompt_overrides)
        self.constrained = constrained
        if constrained:  # before the model loads
            check_constrained_format(self.settings.rollout, "TextToSQL(constrained=True)")
        self.prompts = RequestInput(self.settings, spider_dir or default_spider_dir(), local=True)
        self.database = None  # the live database's name, the default `db`
        if database is not None:  # connected before the model loads: a bad URL fails fast
            from sqlrl.live.databases import LiveLimits, connect, name_of

            rows = self.settings.sample_rows if self.settings.schema_format == "ddl" else 0
            limits = LiveLimits(timeout_s=exec_timeout_s, max_rows=max_rows)
            name = name_of(database)
            if name in self.prompts.schemas:  # a Spider database's name: db= names that one
                name += "_live"
            live = connect(name, database, limits, sample_rows=rows)
            self.prompts.add_live(live)
            self.database = live.name
        self.generator, self.tokenizer = make_generator(
            model_dir,
            use_vllm=use_vllm,
            batch_size=1,
            max_new_tokens=max_new_tokens,
            seed=0,
            progress=False,
        )
        self.executor = SQLExecutor(ExecLimits(timeout_s=exec_timeout_s))
        self.format = get_format(self.settings.rollout)
        self.format.check_tokenizer(self.tokenizer)  # the agent's: a template that calls tools

    def databases(self) -> list[str]:
        """The databases `db=` can name: the Spider folder's (tables.json), and the live one."""
        return sorted(self.prompts.schemas) + sorted(self.prompts.live)

    def refresh(self) -> None:
        """Read the live database's schema again (tables added or changed since)."""
        if self.database is None:
            raise ValueError("no live database: TextToSQL(model, database=URL) connects one")
        self.prompts.live[self.database].refresh()

    def __call__(
        self,
        question: str,
        db: str | None = None,
        *,
        schema: str | None = None,
        ddl: str | None = None,
        constrained: bool | None = None,
    ) -> str:
        """The SQL for `question` (greedy); `constrained`: under its schema's grammar (None:
        the instance's setting)."""
        return self.answer(question, db, schema=schema, ddl=ddl, constrained=constrained).sql

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
        constrained: bool | None = None,
    ) -> Answer:
        """The full answer; `execute` runs it on `db` (read-only); `num_samples` > 1 samples
        at `temperature` and votes by execution result (with `execute`) or by SQL text. An
        agent model's answer carries its `trace`. `constrained` (None: the instance's): every
        sample decoded under the schema's grammar; the Answer's `constrained` says whether it
        was, `unconstrained_reason` why not."""
        from sqlrl.params import check_sampling
        from sqlrl.request_input import check_constrained_format

        check_sampling(num_samples, temperature, "num_samples", "temperature")
        if db is None and schema is None and ddl is None:
            db = self.database  # the live database, when there is one
        given = [
            name
            for name, value in (("db", db), ("schema", schema), ("ddl", ddl))
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(f"give exactly one of db, schema or ddl (got {given or 'none'})")
        if execute and db is None:
            raise ValueError("execute needs a db: a Spider database, or the live one")
        question = unicodedata.normalize("NFC", question).strip()
        db_path = self.prompts.check_db_id(db, need_file=True) if execute else None
        messages = self.prompts.messages(question, schema_str=schema, db_id=db, ddl=ddl)
        decode = dict(n=num_samples, temperature=temperature if num_samples > 1 else 0.0)
        constrained = self.constrained if constrained is None else constrained
        grammar = reason = None
        if constrained:
            check_constrained_format(self.settings.rollout, "constrained=True")
            grammar_for = getattr(self.generator, "grammar_for", None)
            grammar, reason = self.prompts.grammar(grammar_for, db_id=db, ddl=ddl)
            if grammar is not None:  # none: called exactly as unconstrained
                decode["grammars"] = [grammar]
        [asked] = self._loop().ask([messages], [self._tool_db(db)], seed=seed, **decode)
        texts = asked.texts
        known = self.prompts.schema(db_id=db, ddl=ddl) if self.settings.schema_repair else None
        run = None
        if db_path is not None and db in self.prompts.live:
            run = lambda sqls: [db_path.run(sql) for sql in sqls]  # noqa: E731
        elif db_path is not None:
            run = lambda sqls: [self.executor.execute(db_path, sql) for sql in sqls]  # noqa: E731
        answer = finish_answer(
            texts,
            repair=schema_repair(known, question),
            execute=run,
            extract=self.format.extract,
        )
        answer.trace = asked.trace(answer.chosen, answer.sql)  # a tool loop's; else None
        if constrained:
            answer.constrained, answer.unconstrained_reason = grammar is not None, reason
        return answer

    def _loop(self):
        """The format's inference loop over the current `generator` (plain generation, or the
        agent's tool loop with the bounds the model was trained with)."""
        from sqlrl.data.prompts import render_prompt

        return self.format.inference_loop(
            self.generator,
            render=lambda messages: render_prompt(self.tokenizer, messages),
            tokenizer=self.tokenizer,
            answer_format=self.settings.answer_format,
        )

    def _tool_db(self, db: str | None) -> str | None:
        """The database a tool loop probes: `db`'s file where it is present (a plain
        format's loop reads none)."""
        if db is None or db in self.prompts.live:  # a live database has no file to probe
            return None
        path = self.prompts.check_db_id(db, need_file=False)
        return str(path) if path.is_file() else None
