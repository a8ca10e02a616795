"""How a GRPO completion answers (grpo.rollout), and where its SQL is read from.

- `sql` (the default): the prompt as prepare wrote it; the completion is the query
  (sqlrl.sql.extract.extract_sql reads it, as evaluation and serving do).
- `reasoning`: the system prompt asks the model to think inside <think>...</think> and then
  give the query inside one <answer>...</answer> at the end. Tags rather than a final ```sql
  block, because reasoning often drafts queries in code blocks: a tag cannot be confused with
  a draft. Only that final answer is judged (`answer_sql`); a completion without one has no
  SQL and scores 0, so the model cannot be paid for a draft it never committed to.
- `agent`: the system prompt offers the execute_sql tool (sqlrl/train/sql_environment.py,
  run by TRL's tool loop) before the final answer; the SQL is read from the last assistant
  message with no tool call (`final_answer_sql`): an episode that ends on a tool call (out of
  turns or tokens) has no answer and scores 0.

Evaluation, TextToSQL and the server ask a model in the format its folder records
(sqlrl_prompt.json): the same system prompt (`rollout_prompt`), the same extractor
(`EXTRACTORS`), and for the agent the same tool loop (sqlrl/agent.py).
"""

from __future__ import annotations

import re

from sqlrl.sql.extract import completion_text, extract_sql

REASONING_SYSTEM_PROMPT = (
    "You are a text-to-SQL assistant. Given a SQLite database schema and a question, first "
    "think step by step inside <think> </think>, then give one SQLite query inside "
    "<answer> </answer>, and write nothing after it."
)
AGENT_SYSTEM_PROMPT = (
    "You are a text-to-SQL assistant. Given a SQLite database schema and a question, you may "
    "call the execute_sql tool to run read-only queries on the database and see their results. "
    "When you are sure, answer with one SQLite query and nothing else."
)
SYSTEM_PROMPTS = {"reasoning": REASONING_SYSTEM_PROMPT, "agent": AGENT_SYSTEM_PROMPT}

_ANSWER = re.compile(r"<answer>(.*?)</answer>\s*\Z", re.S | re.I)
# The whole shape the format reward pays for: reasoning, then the answer, nothing else.
_REASONING_SHAPE = re.compile(
    r"\A\s*<think>(?:(?!</?think>|</?answer>).)+</think>\s*<answer>(?:(?!</?answer>).)+"
    r"</answer>\s*\Z",
    re.S | re.I,
)


def rollout_rows(rows: list[dict], rollout: str) -> list[dict]:
    """The GRPO rows with the rollout's system prompt in place of prepare's (the rows
    themselves, untouched, for `sql`). A row's prompt is [system, user, ...]."""
    if rollout == "sql":
        return rows
    return [{**row, "prompt": rollout_prompt(row["prompt"], rollout)} for row in rows]


def rollout_prompt(messages: list[dict], rollout: str) -> list[dict]:
    """One prompt's messages with the rollout's system prompt in place of prepare's (the
    messages themselves for `sql`): training (rollout_rows) and inference both call this, so a
    model is asked the way it was trained."""
    if rollout == "sql":
        return messages
    system = SYSTEM_PROMPTS[rollout]
    prompt = list(messages)
    if prompt and prompt[0].get("role") == "system":
        prompt[0] = {**prompt[0], "content": system}
    else:
        prompt.insert(0, {"role": "system", "content": system})
    return prompt


def answer_sql(completion) -> str:
    """`reasoning`: the SQL inside the completion's final <answer>...</answer> (which must end
    it), else "" (no answer: scored 0). Fences or a label inside the tags are allowed."""
    match = _ANSWER.search(completion_text(completion))
    if match is None:
        return ""
    inner = match.group(1)
    if re.search(r"</?answer>", inner, re.I):  # "<answer>a</answer> ... <answer>b</answer>"
        inner = re.split(r"<answer>", inner, flags=re.I)[-1]
    return extract_sql(inner)


def final_answer(completion):
    """`agent`: the completion's last message when it is the assistant's answer (no tool call),
    else None. A plain string (no tool loop ran) is its own answer."""
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, (list, tuple)) or not completion:
        return None
    last = completion[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    return [last]


def final_answer_sql(completion) -> str:
    """`agent`: the SQL of the final answer (extract_sql), "" when the episode has none."""
    answer = final_answer(completion)
    return "" if answer is None else extract_sql(answer)


EXTRACTORS = {"sql": extract_sql, "reasoning": answer_sql, "agent": final_answer_sql}


def reasoning_format_score(completion) -> float:
    """1.0 when the completion is <think>...</think> then <answer>...</answer> and nothing
    else (each non-empty, neither nested), else 0.0."""
    return float(bool(_REASONING_SHAPE.match(completion_text(completion))))
