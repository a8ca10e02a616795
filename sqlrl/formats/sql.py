"""The `sql` format (grpo.rollout's default): the prompt as prepare wrote it, and the
completion is the query (sqlrl.sql.extract.extract_sql reads it, in the reward, evaluation and
serving alike). Every default of `Format` is this format's; it adds no metrics, no SFT rewrite
and no GRPO setting, so a default run's files are byte for byte what they were before formats
existed.
"""

from __future__ import annotations

from sqlrl.formats.base import Format


class SqlFormat(Format):
    name = "sql"
    reports = False  # its files are what they were before formats existed
    recorded = ()  # a sql model's /health record is what it was too
    grammar_constrained = True  # the completion is the query (eval/grpo.constrained)

    def answer_grammar(self, sql_grammar: str) -> str:
        return sql_grammar  # the whole completion is the query
