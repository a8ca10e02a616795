"""grpo.constrained: GRPO rollouts sampled under each prompt's own database grammar
(sqlrl/sql/grammar.py, docs/grammar.md), as eval.constrained decodes evaluation questions.

A rollout batch mixes databases, so the constraint is per row: row i of a batch (one
completion; a prompt's num_generations copies are rows in a row) is masked by the grammar of
its `db_id`'s schema, read from Spider's tables.json as grpo.schema_repair reads it. A row whose
database has no schema there (a training set of prepare.extra_train_sets with its own tables
file) or whose schema yields no grammar (GrammarUnavailable: a name SQL cannot write, no
xgrammar) samples unconstrained in its slot; the reason is logged once per database and the
rows are counted. The trainer hook that applies the grammars is sqlrl/patches.py's
`constrained_rollouts` (why that hook: its docstring).

- transformers: the compiled grammar per row, masked by sqlrl/model/constrained.py's
  GrammarLogitsProcessor, which also ends a dead end (no token allowed mid-query) with a stop
  token and counts it;
- vLLM, colocated, one engine per process: the grammar's EBNF text per prompt, in each
  prompt's own SamplingParams (vLLM compiles it in the engine; dead ends are not reported).

Counts: per rollout batch in TRL's log (`constrained/grammar_share`, `fallback_share`,
`dead_end_share`: shares of the batch's completions, averaged over processes and logging steps
as TRL averages its own), and over the run in metrics/grpo.json's `constrained`.

The loss: TRL scores a rollout with the policy's own, unmasked log-probabilities, so the
update raises the unmasked probability of the tokens the grammar let through. On the
transformers path nothing else sees the mask; on vLLM, TRL's importance-sampling correction
does (docs/grammar.md says how).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class RolloutConstraint:
    """One rollout batch's grammars: `rows[i]` for completion i (None: unconstrained) and, on
    the transformers path, the logits processor that applies them (None without a grammar)."""

    rows: list
    processor: object = None
    owner: RolloutGrammars | None = field(default=None, repr=False)

    def generated(self) -> dict[str, float]:
        """Count the batch once it is generated; the shares TRL logs for it."""
        dead = None if self.processor is None else len(self.processor.dead_ends)
        return self.owner.count(self.rows, dead)


class RolloutGrammars:
    """Each rollout row's grammar by its db_id, built once per database (`build(schema)`: the
    compiled grammar for transformers, the checked EBNF text for vLLM), and the run's counts.
    `stop_id` (transformers) ends a dead-ended row; None builds no processor (vLLM)."""

    def __init__(self, schemas: dict, build, source: str, stop_id: int | None = None):
        self.schemas = schemas
        self.build = build
        self.source = source
        self.stop_id = stop_id
        self.by_db: dict[str, tuple[object, str | None]] = {}
        self.counts = Counter(grammar_rollouts=0, fallback_rollouts=0)
        self.dead_ends: int | None = 0 if stop_id is not None else None
        self.reasons: Counter = Counter()

    def grammar(self, db_id: str):
        """The database's grammar, or None after logging (once) why it has none."""
        from sqlrl.sql.grammar import GrammarUnavailable

        if db_id not in self.by_db:
            schema = self.schemas.get(db_id)
            if schema is None:
                built = (None, f"no schema for the database in {self.source}")
            else:
                try:
                    built = (self.build(schema), None)
                except GrammarUnavailable as exc:
                    built = (None, str(exc))
            if built[1] is not None:
                log.warning(
                    "no grammar for database %r, its rollouts sample unconstrained: %s",
                    db_id,
                    built[1],
                )
            self.by_db[db_id] = built
        return self.by_db[db_id][0]

    def __call__(self, inputs: list[dict]) -> RolloutConstraint:
        """The constraint of a rollout batch: TRL's rows (the dataset's columns), in the order
        it generates them."""
        rows = [self.grammar(row["db_id"]) for row in inputs]
        processor = None
        if self.stop_id is not None and any(g is not None for g in rows):
            from sqlrl.model.constrained import GrammarLogitsProcessor

            processor = GrammarLogitsProcessor(rows, self.stop_id)
        for row in inputs:
            reason = self.by_db[row["db_id"]][1]
            if reason is not None:
                self.reasons[reason] += 1
        return RolloutConstraint(rows, processor, self)

    def count(self, rows: list, dead_ends: int | None) -> dict[str, float]:
        constrained = sum(g is not None for g in rows)
        self.counts["grammar_rollouts"] += constrained
        self.counts["fallback_rollouts"] += len(rows) - constrained
        shares = {
            "constrained/grammar_share": constrained / max(len(rows), 1),
            "constrained/fallback_share": (len(rows) - constrained) / max(len(rows), 1),
        }
        if self.dead_ends is not None:
            self.dead_ends += dead_ends or 0
            shares["constrained/dead_end_share"] = (dead_ends or 0) / max(len(rows), 1)
        return shares

    def summary(self) -> dict:
        """metrics/grpo.json's `constrained`: rollouts sampled under a grammar, those that fell
        back (and why), and the dead ends (None on vLLM, which does not say), over every
        process of the run."""
        from accelerate.utils import gather_object

        mine = [(dict(self.counts), dict(self.reasons), self.dead_ends)]
        counts, reasons, dead = Counter(), Counter(), None
        for c, r, d in gather_object(mine):
            counts.update(c)
            reasons.update(r)
            dead = d if dead is None else dead + (d or 0)
        return {
            "grammar_rollouts": counts["grammar_rollouts"],
            "fallback_rollouts": counts["fallback_rollouts"],
            "fallback_reasons": dict(sorted(reasons.items())),
            "dead_ends": dead,
        }


def rollout_grammars(trainer, tokenizer, spider_dir: str | Path, compose=None) -> RolloutGrammars:
    """grpo.constrained's grammars for the trainer's rollouts: compiled against the policy's
    tokenizer (its embedding rows, and the stop tokens TRL stops at) on the transformers path,
    EBNF text for a colocated vLLM engine. `compose`: the rollout format's answer template
    around the query (its Format's `answer_grammar`)."""
    from sqlrl.data.spider import load_schemas
    from sqlrl.sql.grammar import (
        GrammarUnavailable,
        checked_grammar_text,
        compiled_grammar,
        hf_tokenizer_info,
    )

    tables = Path(spider_dir) / "tables.json"
    schemas = load_schemas(tables)
    if trainer.use_vllm:
        return RolloutGrammars(schemas, lambda s: checked_grammar_text(s, compose), tables.name)
    stops = list(trainer.eos_token_ids)
    try:
        info = hf_tokenizer_info(tokenizer, trainer.model.config.vocab_size, stops)
    except GrammarUnavailable as exc:  # no xgrammar: every row falls back, the reason logged
        reason = str(exc)

        def build(schema):
            raise GrammarUnavailable(reason)

    else:

        def build(schema):
            return compiled_grammar(schema, info, compose)

    return RolloutGrammars(schemas, build, tables.name, stops[0])
