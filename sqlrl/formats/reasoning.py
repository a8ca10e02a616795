"""The `reasoning` format: the system prompt asks the model to think inside
<think>...</think> and then give the query inside one <answer>...</answer> at the end.

Tags rather than a final ```sql block, because reasoning often drafts queries in code blocks:
a tag cannot be confused with a draft. Only that final answer is judged (`answer_sql`); a
completion without one has no SQL and scores 0, so the model cannot be paid for a draft it
never committed to. The `format` reward (sqlrl/train/rewards.py) pays for the whole shape
(`reasoning_format_score`), and evaluation reports its mean and the share of completions
without an answer.

SFT rows: the completion is `<think>` a short plan read off the gold query (its tables and
clauses) `</think>` then `<answer>` the gold `</answer>`: the shape the extractor reads and
the format reward pays for. The plan is a template, not reasoning: SFT teaches the shape,
GRPO what to think.

Constrained decoding (eval.constrained, grpo.constrained): `answer_grammar` holds only the
answer to the database's grammar: `<think>`, free text up to the first `</think>` (xgrammar's
TagDispatch: any text until the tag), then `<answer>`, the query under the grammar,
`</answer>`, and nothing after it but whitespace. The thinking may name anything. A completion
may still end inside `<think>` (TagDispatch lets free text end): no answer, scored 0, as
without the grammar.
"""

from __future__ import annotations

import re

from sqlrl.formats.base import Asked, Format, GoldSftFormatter, gold_tables
from sqlrl.sql.extract import completion_text, extract_sql, normalize_sql_whitespace

REASONING_SYSTEM_PROMPT = (
    "You are a text-to-SQL assistant. Given a SQLite database schema and a question, first "
    "think step by step inside <think> </think>, then give one SQLite query inside "
    "<answer> </answer>, and write nothing after it."
)

_ANSWER = re.compile(r"<answer>(.*?)</answer>\s*\Z", re.S | re.I)
# The whole shape the format reward pays for: reasoning, then the answer, nothing else.
_REASONING_SHAPE = re.compile(
    r"\A\s*<think>(?:(?!</?think>|</?answer>).)+</think>\s*<answer>(?:(?!</?answer>).)+"
    r"</answer>\s*\Z",
    re.S | re.I,
)


def answer_sql(completion) -> str:
    """The SQL inside the completion's final <answer>...</answer> (which must end it), else
    "" (no answer: scored 0). Fences or a label inside the tags are allowed."""
    match = _ANSWER.search(completion_text(completion))
    if match is None:
        return ""
    inner = match.group(1)
    if re.search(r"</?answer>", inner, re.I):  # "<answer>a</answer> ... <answer>b</answer>"
        inner = re.split(r"<answer>", inner, flags=re.I)[-1]
    return extract_sql(inner)


def reasoning_format_score(completion) -> float:
    """1.0 when the completion is <think>...</think> then <answer>...</answer> and nothing
    else (each non-empty, neither nested), else 0.0."""
    return float(bool(_REASONING_SHAPE.match(completion_text(completion))))


_CLAUSES = (  # (pattern on the upper-cased query, what the plan says)
    (r"\bJOIN\b", "join the tables"),
    (r"\bWHERE\b", "filter the rows"),
    (r"\bGROUP BY\b", "group"),
    (r"\bHAVING\b", "filter the groups"),
    (r"\bORDER BY\b", "sort"),
    (r"\bLIMIT\b", "keep the top rows"),
    (r"\b(UNION|INTERSECT|EXCEPT)\b", "combine two queries"),
    (r"\(\s*SELECT\b", "use a subquery"),
)


def reasoning_plan(sql: str) -> str:
    """A short plan read off the gold: the tables it uses and the clauses it needs."""
    tables = gold_tables(sql)
    upper = sql.upper()
    steps = [say for pattern, say in _CLAUSES if re.search(pattern, upper)]
    plan = f"The answer needs the table{'s' if len(tables) != 1 else ''} " + (
        ", ".join(tables) if tables else "of the schema"
    )
    return plan + (f"; it must {', '.join(steps)}." if steps else ".")


def reasoning_completion(sql: str) -> list[dict]:
    """The reasoning format's assistant turn for a gold query (its whitespace collapsed)."""
    sql = normalize_sql_whitespace(sql)
    content = f"<think>\n{reasoning_plan(sql)}\n</think>\n<answer>\n{sql}\n</answer>"
    return [{"role": "assistant", "content": content}]


class ReasoningSft(GoldSftFormatter):
    def turns(self, answer: str, source: dict | None) -> dict:
        return {"completion": reasoning_completion(answer)}


# The answer template around a query grammar whose root is renamed `sql_root`: free thinking
# until `</think>` (TagDispatch: free text until one of its tags, then that tag's rule), then
# the answer and only whitespace after it (REASONING_SYSTEM_PROMPT's shape).
_ANSWER_GRAMMAR = r"""
root ::= [ \t\r\n]* "<think>" reasoning_think
reasoning_think ::= TagDispatch(
  ("</think>", reasoning_answer),
  loop_after_dispatch=false,
  excludes=()
)
reasoning_answer ::= [ \t\r\n]* "<answer>" sql_root "</answer>" [ \t\r\n]*
"""


class ReasoningFormat(Format):
    name = "reasoning"
    system_prompt = REASONING_SYSTEM_PROMPT
    grammar_constrained = True  # the answer span only (`answer_grammar`)

    def answer_grammar(self, sql_grammar: str) -> str:
        renamed, found = re.subn(r"^root ::=", "sql_root ::=", sql_grammar, count=1, flags=re.M)
        if not found:
            raise ValueError("the query grammar has no `root` rule")
        return renamed.rstrip("\n") + "\n" + _ANSWER_GRAMMAR.lstrip("\n")

    def extract(self, completion) -> str:
        return answer_sql(completion)

    def sft_formatter(self, grpo) -> ReasoningSft:
        return ReasoningSft(self)

    def metrics(self, asked: list[Asked], outputs: list[str]) -> dict:
        """The format reward's mean (the whole <think>/<answer> shape) and the share of
        completions without a final <answer> to judge."""
        n = len(outputs)
        if not n:
            return {"rollout": self.name, "mean_format_reward": None, "no_answer_share": None}
        return {
            "rollout": self.name,
            "mean_format_reward": round(sum(map(reasoning_format_score, outputs)) / n, 4),
            "no_answer_share": round(sum(answer_sql(o) == "" for o in outputs) / n, 4),
        }
