"""The `agent` format: the system prompt offers the execute_sql tool
(sqlrl/formats/sql_environment.py) before the final answer.

- Training: GRPO hands TRL the environment (`environment`) and TRL runs the tool loop, at most
  grpo.agent.max_turns rounds of calls (`trainer_settings`); the per-turn completion budget
  (sqlrl/patches.py) applies. The pass rates of grpo_prompts are sampled in the `sql` format:
  their generator runs no tool loop, and a question the model answers directly some of the
  time is one it can learn to answer with the tool's help.
- The answer: the SQL is read from the last assistant message with no tool call
  (`final_answer_sql`): an episode that ends on a tool call (out of turns or tokens) has no
  answer and scores 0.
- SFT rows: the row carries the tool's schema (`tools`, rendered by the chat template as GRPO
  renders it) and the completion is a trajectory: a call that looks at the gold's main table
  (`SELECT * FROM t LIMIT 3`), the tool's REAL answer on the question's database from the same
  SQLEnvironment GRPO runs (same bounds: grpo.agent.*, grpo.reward_timeout_s), then the gold
  as the final answer. SFT trains on the call and the answer, never on the tool's answer
  (sqlrl/train/sft.py). The schema-grounding copies (renamed tables, no database to run on)
  answer without a tool call: the agent may answer at once, and does when it has nothing to
  look up.
- Inference: the tool loop TRL runs in training, over a Generator (sqlrl/formats/tool_loop.py),
  with the bounds the model was trained with (sqlrl_prompt.json); evaluation reports its
  episodes' tool calls, turns, failed calls and answers, and each prediction its trace.
"""

from __future__ import annotations

from sqlrl.formats.base import Asked, Format, GoldSftFormatter, gold_tables, quoted
from sqlrl.sql.extract import extract_sql

AGENT_SYSTEM_PROMPT = (
    "You are a text-to-SQL assistant. Given a SQLite database schema and a question, you may "
    "call the execute_sql tool to run read-only queries on the database and see their results. "
    "When you are sure, answer with one SQLite query and nothing else."
)
TOOL_NAME = "execute_sql"
PROBE_ROWS = 3  # rows the SFT trajectory's exploratory query asks for
# the sqlrl_prompt.json fields of the agent: the format and the tool's bounds
AGENT_SETTINGS = ("rollout", "max_turns", "max_rows", "max_chars", "tool_timeout_s")


def final_answer(completion):
    """The completion's last message when it is the assistant's answer (no tool call), else
    None. A plain string (no tool loop ran) is its own answer."""
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, (list, tuple)) or not completion:
        return None
    last = completion[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    return [last]


def final_answer_sql(completion) -> str:
    """The SQL of the final answer (extract_sql), "" when the episode has none."""
    answer = final_answer(completion)
    return "" if answer is None else extract_sql(answer)


def probe_query(sql: str) -> str | None:
    """The agent's exploratory query for a gold query: a look at its main table's first rows;
    None when the gold names no table."""
    tables = gold_tables(sql)
    return f"SELECT * FROM {quoted(tables[0])} LIMIT {PROBE_ROWS}" if tables else None


def tool_call_message(query: str, name: str = TOOL_NAME) -> dict:
    """An assistant turn that calls the tool, as TRL parses Qwen2.5's <tool_call> back."""
    call = {"type": "function", "function": {"name": name, "arguments": {"query": query}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def grpo_environment(grpo):
    """A SQLEnvironment with grpo's bounds (GrpoParams: grpo.agent.*, the reward's time
    limit), as GRPO builds each rollout's."""
    from sqlrl.formats.sql_environment import SQLEnvironment
    from sqlrl.sql.executor import ExecLimits

    return SQLEnvironment(
        ExecLimits(timeout_s=grpo.reward_timeout_s),
        max_turns=grpo.agent.max_turns,
        max_rows=grpo.agent.max_rows,
        max_chars=grpo.agent.max_chars,
    )


class AgentSft(GoldSftFormatter):
    """Trajectories whose observations are the real tool's, bounded as GRPO bounds them."""

    def __init__(self, answer_format: Format, grpo):
        from sqlrl.formats.sql_environment import tool_schemas

        super().__init__(answer_format)
        self.environment = grpo_environment(grpo)
        self.tools = tool_schemas()

    def observe(self, db_path: str, query: str) -> str:
        """What execute_sql answers to `query` on the database at db_path, as in GRPO."""
        self.environment.reset(db_path=db_path)
        return self.environment.execute_sql(query)

    def turns(self, answer: str, source: dict | None) -> dict:
        return {"completion": self._trajectory(answer, source), "tools": self.tools}

    def stats(self) -> dict:  # errors, time-outs: real observations all the same
        counts = self.environment.stats
        return {"tool_calls": counts.calls, "failed_tool_calls": counts.failed_calls}

    def _trajectory(self, answer: str, source: dict | None) -> list[dict]:
        """A look at the gold's main table and the tool's answer, then the gold; the answer
        alone for a copy (no database) or a gold that names no table."""
        final = {"role": "assistant", "content": answer}
        query = probe_query(source["gold_sql"]) if source is not None else None
        if query is None:
            return [final]
        observation = self.observe(source["db_path"], query)
        tool = {"role": "tool", "name": TOOL_NAME, "content": observation}
        return [tool_call_message(query), tool, final]


class AgentFormat(Format):
    name = "agent"
    system_prompt = AGENT_SYSTEM_PROMPT
    calls_tools = True
    recorded = AGENT_SETTINGS

    def extract(self, completion) -> str:
        return final_answer_sql(completion)

    def pass_rate_format(self) -> Format:
        from sqlrl.formats.sql import SqlFormat

        return SqlFormat()

    def prompt_settings(self, grpo) -> dict:
        """The format and its tool's bounds (they mean nothing to another format, so
        changing them leaves another format's file alone)."""
        agent = grpo.agent
        return {
            "rollout": self.name,
            "max_turns": agent.max_turns,
            "max_rows": agent.max_rows,
            "max_chars": agent.max_chars,
            "tool_timeout_s": float(grpo.reward_timeout_s),
        }

    def sft_formatter(self, grpo) -> AgentSft:
        return AgentSft(self, grpo)

    def trainer_settings(self, grpo) -> dict:
        """TRL's tool turns: grpo.agent.max_turns."""
        return {"max_tool_calling_iterations": grpo.agent.max_turns}

    def environment(self, grpo):
        """The execute_sql tool with the reward's time limit and grpo.agent's bounds."""
        from sqlrl.formats.sql_environment import environment_factory
        from sqlrl.sql.executor import ExecLimits

        agent = grpo.agent
        return environment_factory(
            ExecLimits(timeout_s=grpo.reward_timeout_s),
            agent.max_turns,
            agent.max_rows,
            agent.max_chars,
        )

    def check_tokenizer(self, tokenizer) -> None:
        """A chat template that cannot call tools is refused (with why)."""
        from sqlrl.formats.tool_loop import with_response_parser

        with_response_parser(tokenizer)

    def inference_loop(self, generator, *, render, tokenizer=None, answer_format=None):
        """The tool loop (sqlrl/formats/tool_loop.py): every turn rendered by the tokenizer's
        chat template with the tool's schema, the model's bounds from its AnswerFormat."""
        from sqlrl.formats.tool_loop import AgentLoop

        if tokenizer is None:
            raise ValueError("an agent-format model's generator needs its tokenizer")
        return AgentLoop(generator, tokenizer, answer_format)

    def metrics(self, asked: list[Asked], outputs: list[str]) -> dict:
        from sqlrl.formats.tool_loop import agent_stats

        return {"rollout": self.name, **agent_stats([e for q in asked for e in q.episodes])}
