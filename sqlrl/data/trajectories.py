"""SFT rows in the GRPO rollout's format: `grpo.rollout` is the one setting that says how a
model answers, so prepare writes sft.jsonl in that format and GRPO samples in it (a model
trained in one format and asked in another would start RL from nothing).

- `sql`: the rows as they are (sft.jsonl byte-identical to the pipeline before formats).
- `reasoning`: the system prompt asks for <think> then <answer> (sqlrl/train/rollouts.py) and
  the completion is `<think>` a short plan read off the gold query (its tables and clauses)
  `</think>` then `<answer>` the gold `</answer>`: the shape the extractor reads and the format
  reward pays for. The plan is a template, not reasoning: SFT teaches the shape, GRPO what
  to think.
- `agent`: the system prompt offers execute_sql, the row carries the tool's schema (`tools`,
  rendered by the chat template as GRPO renders it) and the completion is a trajectory: a call
  that looks at the gold's main table (`SELECT * FROM t LIMIT 3`), the tool's REAL answer on
  the question's database from the same SQLEnvironment GRPO runs (same bounds:
  grpo.agent.*, grpo.reward_timeout_s), then the gold as the final answer. SFT trains on
  the call and the answer, never on the tool's answer (sqlrl/train/sft.py).
The schema-grounding copies (renamed tables, no database to run on) answer in the format
without a tool call: the agent may answer at once, and does when it has nothing to look up.
"""

from __future__ import annotations

import re

PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PROBE_ROWS = 3  # rows the exploratory query asks for


def _parsed(sql: str):
    import sqlglot
    from sqlglot.errors import SqlglotError

    try:
        return sqlglot.parse_one(sql, read="sqlite")
    except (SqlglotError, ValueError, RecursionError):
        return None


def gold_tables(sql: str) -> list[str]:
    """The tables a query reads, outermost FROM first (breadth-first), each once; [] when
    sqlglot cannot parse it."""
    from sqlglot import exp

    parsed = _parsed(sql)
    if parsed is None:
        return []
    names = [t.name for t in parsed.find_all(exp.Table, bfs=True) if t.name]
    return list(dict.fromkeys(names))


def _quoted(name: str) -> str:
    return name if PLAIN_NAME.match(name) else '"' + name.replace('"', '""') + '"'


def probe_query(sql: str) -> str | None:
    """The agent's exploratory query for a gold query: a look at its main table's first rows;
    None when the gold names no table."""
    tables = gold_tables(sql)
    return f"SELECT * FROM {_quoted(tables[0])} LIMIT {PROBE_ROWS}" if tables else None


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
    from sqlrl.data.prompts import normalize_sql_whitespace

    sql = normalize_sql_whitespace(sql)
    content = f"<think>\n{reasoning_plan(sql)}\n</think>\n<answer>\n{sql}\n</answer>"
    return [{"role": "assistant", "content": content}]


def tool_call_message(query: str, name: str = "execute_sql") -> dict:
    """An assistant turn that calls the tool, as TRL parses Qwen2.5's <tool_call> back."""
    call = {"type": "function", "function": {"name": name, "arguments": {"query": query}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


class SftFormatter:
    """Rewrites prepare's SFT rows into grpo.rollout's format (see the module docstring)."""

    def __init__(self, grpo):
        """`grpo`: GrpoParams (rollout, agent bounds, the reward's time limit)."""
        self.rollout = grpo.rollout
        self.environment = None
        self.tools = None
        if self.rollout == "agent":
            from sqlrl.sql.executor import ExecLimits
            from sqlrl.train.sql_environment import SQLEnvironment, tool_schemas

            self.environment = SQLEnvironment(
                ExecLimits(timeout_s=grpo.reward_timeout_s),
                max_turns=grpo.agent.max_turns,
                max_rows=grpo.agent.max_rows,
                max_chars=grpo.agent.max_chars,
            )
            self.tools = tool_schemas()

    def observe(self, db_path: str, query: str) -> str:
        """What execute_sql answers to `query` on the database at db_path, as in GRPO."""
        self.environment.reset(db_path=db_path)
        return self.environment.execute_sql(query)

    def format_rows(self, sft_rows: list[dict], sources: list[dict | None]) -> dict:
        """Rewrite sft_rows in place; sources[i] holds sft_rows[i]'s gold_sql and db_path
        (None, or past the end: a schema-grounding copy, with no database to look at).
        Returns the counts for metrics/prepare.json ({} for `sql`: nothing changes)."""
        if self.rollout == "sql":
            return {}
        from sqlrl.train.rollouts import rollout_rows

        stats = {"rollout": self.rollout, "rows": len(sft_rows)}
        formatted = rollout_rows(sft_rows, self.rollout)  # the rollout's system prompt
        for i, row in enumerate(formatted):
            answer = row["completion"][-1]["content"]  # prepare's turn: the (renamed) gold
            grpo = sources[i] if i < len(sources) else None
            if self.rollout == "reasoning":
                row["completion"] = reasoning_completion(answer)
            else:
                row["completion"] = self._trajectory(answer, grpo)
                row["tools"] = self.tools
            sft_rows[i] = row
        if self.environment is not None:  # errors, time-outs: real observations all the same
            counts = self.environment.stats
            stats.update(tool_calls=counts.calls, failed_tool_calls=counts.failed_calls)
        return stats

    def _trajectory(self, answer: str, grpo: dict | None) -> list[dict]:
        """A look at the gold's main table and the tool's answer, then the gold; the answer
        alone for a copy (no database) or a gold that names no table."""
        final = {"role": "assistant", "content": answer}
        query = probe_query(grpo["gold_sql"]) if grpo is not None else None
        if query is None:
            return [final]
        observation = self.observe(grpo["db_path"], query)
        tool = {"role": "tool", "name": "execute_sql", "content": observation}
        return [tool_call_message(query), tool, final]
