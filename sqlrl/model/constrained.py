"""Schema-constrained decoding with transformers: each row of a `generate` batch masked by its
own database's grammar (sqlrl/sql/grammar.py), or by none.

`GrammarLogitsProcessor` does what `xgrammar.contrib.hf.LogitsProcessor` (xgrammar 0.2.8) does,
one xgrammar GrammarMatcher per row that accepts the token chosen at the last step and fills
that row's token bitmask, plus what evaluation needs and that class lacks:
- a row without a grammar (None: its schema yields none, `GrammarUnavailable`) is left
  unmasked in its slot, so that one batch holds constrained and unconstrained rows and the
  batching, length order and shared prefill stay what they are without a grammar;
- a dead end (the grammar allows no token, yet the query is not complete: a vocabulary that
  cannot spell what the grammar needs next) ends the row with a stop token and is counted
  (`dead_ends`), where xgrammar's class masks every token, and transformers then takes token 0
  greedily (and xgrammar's `assert accept_token` fails) or draws from NaN probabilities;
- a row that has finished (its matcher accepted a stop token, or it dead-ended) is unmasked
  rather than left with its last mask, so a sampling step never sees a row of -inf.
A processor holds matcher state: one per `generate` call, as xgrammar's.
"""

from __future__ import annotations

from transformers import LogitsProcessor


class GrammarLogitsProcessor(LogitsProcessor):
    """Masks row i of the batch by `grammars[i]` (an xgrammar CompiledGrammar against the
    model's tokenizer, or None: unmasked). `stop_id` ends a dead-ended row; `dead_ends` holds
    the rows that dead-ended, `completed` (after the call) the rows whose grammar accepted
    a stop token."""

    def __init__(self, grammars: list, stop_id: int):
        import xgrammar

        present = [g for g in grammars if g is not None]
        if not present:
            raise ValueError("no grammar in the batch: generate without a processor")
        self._xgr = xgrammar
        self.matchers = [xgrammar.GrammarMatcher(g) if g is not None else None for g in grammars]
        self.vocab_size = present[0].tokenizer_info.vocab_size
        self.bitmask = xgrammar.allocate_token_bitmask(len(grammars), self.vocab_size)
        self.stop_id = stop_id
        self.dead_ends: set[int] = set()
        self.started = False

    def _open(self, i: int) -> bool:
        """Whether row i is still decoded under its grammar."""
        matcher = self.matchers[i]
        return matcher is not None and i not in self.dead_ends and not matcher.is_terminated()

    @property
    def completed(self) -> set[int]:
        return {i for i, m in enumerate(self.matchers) if m is not None and m.is_terminated()}

    def __call__(self, input_ids, scores):
        if input_ids.shape[0] != len(self.matchers):
            raise RuntimeError(
                f"a batch of {input_ids.shape[0]} rows for a processor of {len(self.matchers)}"
            )
        if self.started:  # the tokens chosen at the last step (none before the first)
            last = input_ids[:, -1].tolist()
            for i, matcher in enumerate(self.matchers):
                if self._open(i) and not matcher.accept_token(last[i]):
                    raise RuntimeError(f"row {i}: token {last[i]} was chosen against its mask")
        self.started = True
        for i, matcher in enumerate(self.matchers):
            if not self._open(i):
                self.bitmask[i].fill_(-1)  # every bit set: every token allowed
                continue
            matcher.fill_next_token_bitmask(self.bitmask, i)
            if not bool(self.bitmask[i].any()):
                self.dead_ends.add(i)
                self.bitmask[i].zero_()
                word, bit = divmod(self.stop_id, 32)
                self.bitmask[i, word] = (1 << bit) - (1 << 32 if bit == 31 else 0)
        device = scores.device
        on_cpu = scores if device.type == "cuda" else scores.to("cpu")
        self._xgr.apply_token_bitmask_inplace(
            on_cpu, self.bitmask.to(on_cpu.device), vocab_size=self.vocab_size
        )
        return on_cpu if device.type == "cuda" else on_cpu.to(device)
