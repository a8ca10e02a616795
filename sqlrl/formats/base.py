"""What an answer format is: the one interface every format implements (`Format`), and the
parts the formats share: the system prompt put in place of prepare's, SFT rows rewritten from
their gold, and the plain inference loop (one generation per sample).

A format decides, in one place, everything that depends on how a model answers: its system
prompt, how its SQL is read from a completion, the SFT rows prepare writes for it, what GRPO
adds for it (TRL settings, an environment), how inference asks it (a plain generation or a
tool loop) and the metrics it adds. Evaluation, TextToSQL, the server, prepare, grpo_prompts
and grpo ask the format object (sqlrl.formats.get_format) rather than compare its name, so a
new format is one module and its registry line (docs/rollouts.md).

Nothing here imports sqlrl.data, sqlrl.train, sqlrl.eval or sqlrl.serve: they import this.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlrl.sql.extract import extract_sql


class Format:
    """An answer format. A subclass sets `name` (grpo.rollout's value, saved with the model as
    sqlrl_prompt.json's `rollout`) and overrides what differs from the plain `sql` format."""

    name: str = ""
    # the system prompt put in place of prepare's (None: prepare's prompt as it is)
    system_prompt: str | None = None
    # the tool calls of training and inference (TRL's tool loop; the agent's bounds recorded)
    calls_tools: bool = False
    # the format's own metrics (`rollout`, ...) in training's and evaluation's files; False
    # keeps a format's files byte for byte what they were before formats existed (sql)
    reports: bool = True
    # sqlrl_prompt.json fields of the format that the server's /health shows
    recorded: tuple[str, ...] = ("rollout",)
    # whether `answer_grammar` builds the grammar of a whole completion around the query's
    # (sqlrl/sql/grammar.py): only then can eval.constrained and grpo.constrained decode it
    grammar_constrained: bool = False

    def __repr__(self) -> str:
        return f"<answer format {self.name!r}>"

    # ----------------------------------------------------------------- prompts and answers
    def extract(self, completion) -> str:
        """The SQL a completion answers with ("" for none): scored, rewarded and served."""
        return extract_sql(completion)

    def prompt(self, messages: list[dict]) -> list[dict]:
        """One prompt's messages with the format's system prompt in place of prepare's (the
        messages themselves without one): training (`rows`) and inference both call this,
        so a model is asked the way it was trained."""
        if self.system_prompt is None:
            return messages
        prompt = list(messages)
        if prompt and prompt[0].get("role") == "system":
            prompt[0] = {**prompt[0], "content": self.system_prompt}
        else:
            prompt.insert(0, {"role": "system", "content": self.system_prompt})
        return prompt

    def rows(self, rows: list[dict]) -> list[dict]:
        """Rows whose `prompt` is [system, user, ...] with the format's system prompt (the
        rows themselves, untouched, without one): GRPO's, the pass rates', SFT's."""
        if self.system_prompt is None:
            return rows
        return [{**row, "prompt": self.prompt(row["prompt"])} for row in rows]

    def pass_rate_format(self) -> Format:
        """The format grpo_prompts samples the SFT model's pass rates in (its generator runs
        no tool loop): this one."""
        return self

    def answer_grammar(self, sql_grammar: str) -> str:
        """The EBNF (xgrammar's dialect, root rule `root`) of a whole completion in this format,
        given `sql_grammar`, one database's query grammar (sqlrl/sql/grammar.py, root `root`):
        the format's answer template with the query in its place, so that only the query is
        held to the schema. Only where `grammar_constrained`."""
        raise NotImplementedError(f"the {self.name!r} format has no answer grammar")

    # ----------------------------------------------------------------- training
    def prompt_settings(self, grpo) -> dict:
        """The answer-format fields sqlrl_prompt.json saves for a model trained with `grpo`
        (GrpoParams): the format's name (the agent adds its tool's bounds)."""
        return {"rollout": self.name}

    def sft_formatter(self, grpo) -> SftFormatter:
        """What rewrites prepare's SFT rows into the format (sft.jsonl)."""
        return SftFormatter(self)

    def trainer_settings(self, grpo) -> dict:
        """GRPOConfig settings only this format sets (none: the config of a run before
        formats existed)."""
        return {}

    def environment(self, grpo):
        """(TRL's environment_factory, its EpisodeStats) for GRPOTrainer, or (None, None)."""
        return None, None

    # ----------------------------------------------------------------- inference
    def check_tokenizer(self, tokenizer) -> None:
        """Refuse a tokenizer the format cannot be asked through (at a server's start)."""

    def inference_loop(self, generator, *, render, tokenizer=None, answer_format=None):
        """How inference asks a model in this format, over a `Generator`
        (sqlrl/model/generate.py): `render` turns messages into the prompt text; the
        tokenizer and the model's AnswerFormat (its tool bounds) serve a tool loop."""
        return PlainLoop(generator, render)

    def metrics(self, asked: list[Asked], outputs: list[str]) -> dict:
        """The format's metrics of one evaluated split: `asked` as the loop returned them,
        `outputs` the chosen completions."""
        return {"rollout": self.name} if self.reports else {}


# --------------------------------------------------------------------------- SFT rows


class SftFormatter:
    """prepare's SFT rows in a format: as they are (the `sql` format: sft.jsonl
    byte-identical to the pipeline before formats)."""

    def __init__(self, answer_format: Format):
        self.format = answer_format

    def format_rows(self, sft_rows: list[dict], sources: list[dict | None]) -> dict:
        """Rewrite sft_rows in place; sources[i] holds sft_rows[i]'s gold_sql and db_path
        (None, or past the end: a schema-grounding copy, with no database to look at).
        Returns the counts for metrics/prepare.json ({}: nothing changes)."""
        return {}


class GoldSftFormatter(SftFormatter):
    """SFT rows rewritten from their gold: the format's system prompt, and the completion the
    format's `turns` builds from prepare's answer (the gold, renamed in a copy)."""

    def format_rows(self, sft_rows: list[dict], sources: list[dict | None]) -> dict:
        stats = {"rollout": self.format.name, "rows": len(sft_rows)}
        formatted = self.format.rows(sft_rows)  # the format's system prompt
        for i, row in enumerate(formatted):
            answer = row["completion"][-1]["content"]  # prepare's turn: the (renamed) gold
            source = sources[i] if i < len(sources) else None
            row.update(self.turns(answer, source))
            sft_rows[i] = row
        stats.update(self.stats())
        return stats

    def turns(self, answer: str, source: dict | None) -> dict:
        """The row's fields in the format: its `completion` (and what goes with it)."""
        raise NotImplementedError

    def stats(self) -> dict:
        """Counts added to the metrics after every row is written."""
        return {}


PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _parsed(sql: str):
    import sqlglot
    from sqlglot.errors import SqlglotError

    try:
        return sqlglot.parse_one(sql, read="sqlite")
    except (SqlglotError, ValueError, RecursionError):
        return None


def gold_tables(sql: str) -> list[str]:
    """The tables a query reads, outermost FROM first (breadth-first), each once; [] when
    sqlglot cannot parse it: what the formats' SFT turns read off a gold query."""
    from sqlglot import exp

    parsed = _parsed(sql)
    if parsed is None:
        return []
    names = [t.name for t in parsed.find_all(exp.Table, bfs=True) if t.name]
    return list(dict.fromkeys(names))


def quoted(name: str) -> str:
    """A table name as SQLite reads it (double quotes where it is not a plain name)."""
    return name if PLAIN_NAME.match(name) else '"' + name.replace('"', '""') + '"'


# --------------------------------------------------------------------------- inference


@dataclass
class Asked:
    """One question's samples as a format's inference loop produced them."""

    texts: list[str]  # each sample's answer text ("" for an episode without one)
    episodes: list | None = None  # a tool loop's Episodes behind `texts`

    def trace(self, chosen: int, sql: str) -> dict | None:
        """The chosen sample's probes and final SQL (a tool loop's), else None."""
        return None if self.episodes is None else self.episodes[chosen].trace(sql)


class PlainLoop:
    """Inference in a plain format: each prompt rendered once and generated in one call for
    all of them, greedy (temperature 0) or `n` samples at `temperature`.

    Every inference loop has this shape: `first_prompt` (what a length check counts),
    `ask` (questions -> one Asked each, synchronous: evaluation, TextToSQL) and `ask_async`
    (one question, for the server)."""

    def __init__(self, generator, render: Callable[[list[dict]], str]):
        self.generator = generator
        self.render = render

    def first_prompt(self, messages: list[dict]) -> str:
        """The prompt text of the first (here: only) generation, as a length check counts it."""
        return self.render(messages)

    def ask(
        self,
        prompts: list[list[dict]],
        db_paths: list[str | None],
        *,
        n: int = 1,
        temperature: float = 0.0,
        seed: int = 0,
        grammars: list | None = None,
    ) -> list[Asked]:
        """One Asked per prompt (chat messages in the format); no database is read.
        `grammars`: one per prompt for a generator that decodes under a grammar (its
        `grammar_for`'s, None for unconstrained); without it the generator is called as
        every generator can be."""
        rendered = [self.render(m) for m in prompts]
        texts = self._generate(rendered, n, temperature, seed, grammars)
        return [Asked(group) for group in texts]

    def _generate(self, rendered: list[str], n: int, temperature: float, seed: int, grammars=None):
        constrained = {} if grammars is None else {"grammars": grammars}
        if n > 1 or temperature > 0.0:
            samples = self.generator.sample(rendered, n, temperature, seed, **constrained)
        else:
            samples = [[text] for text in self.generator.generate(rendered, **constrained)]
        if len(samples) != len(rendered):
            raise RuntimeError(
                f"the generator returned {len(samples)} results for {len(rendered)} prompts"
            )
        return samples

    async def ask_async(
        self, messages: list[dict], db_path, *, prompt: str, n: int, temperature: float, seed: int
    ) -> Asked:
        """One question on an async generator (the server's backend, `acomplete`): the
        `prompt` already rendered, sent as one request, on the event loop."""
        return Asked(await self.generator.acomplete(prompt, n, temperature, seed))
