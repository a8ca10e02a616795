"""What the agent's tool turns cost in Qwen2.5 tokens: the numbers grpo.max_completion_length,
grpo.agent.max_chars and grpo.vllm_max_model_length are sized from (docs/rollouts.md).

    python benchmarks/bench_agent_budget.py [--profile qwen2.5-coder-3b-agent]
        [--max-chars 2000 1200 ...] [--every 1]

For each Spider train question (train_spider.json, every --every-th) whose gold names a table,
three queries run through the GRPO tool itself (SQLEnvironment with the profile's
grpo.agent.max_rows, max_chars and grpo.reward_timeout_s) on the question's database:
- probe: SFT's trajectory call, `SELECT * FROM <the gold's main table> LIMIT 3`
  (sqlrl/formats/agent.py);
- table: that table without the LIMIT (what max_rows and max_chars bound);
- gold: the gold query itself (a draft answer checked before answering).
Each is counted in Qwen2.5's real tokenizer (offline: sqlrl/model/qwen_tokenizer.py) as TRL
1.16 counts it against max_completion_length: the call as the model writes it
(`<tool_call>...</tool_call><|im_end|>`), the observation as TRL appends it
(GRPOTrainer._get_tool_suffix_ids: `\\n<|im_start|>user\\n<tool_response>\\n...` up to the next
`<|im_start|>assistant\\n`), the answer (the gold, whitespace collapsed, and `<|im_end|>`).
Printed: median, p90, p99 and max of an observation, of a call with its observation, and of a
whole one-look episode (call, observation, answer), per query kind and max_chars; then the
prompt's fixed cost over prepare.max_prompt_tokens (the agent's system prompt and tool schema).
Not timed; about 20 s per max_chars value on 2 cores (the gold queries run in the sandbox).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlrl.data.prompts import build_messages, normalize_sql_whitespace  # noqa: E402
from sqlrl.formats.agent import AGENT_SYSTEM_PROMPT, probe_query, tool_call_message  # noqa: E402
from sqlrl.formats.sql_environment import SQLEnvironment, tool_schemas  # noqa: E402
from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer  # noqa: E402
from sqlrl.params import compose_params, params_from_dict  # noqa: E402
from sqlrl.sql.executor import ExecLimits  # noqa: E402

SPIDER = REPO / "data/raw/spider"
QUANTILES = (("median", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))


def quantile(sorted_values: list[int], q: float) -> int:
    """Nearest rank: the smallest value with at least a share q of the values at or below."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


class Counter:
    """Token counts of the pieces of an episode, as TRL builds its completion ids."""

    def __init__(self):
        self.tokenizer = build_qwen25_tokenizer()
        self.eos = self.tokenizer.eos_token_id
        self._call = [{"role": "user", "content": "?"}, tool_call_message("SELECT 1")]
        self._cache: dict[str, int] = {}

    def ids(self, messages, generation_prompt=False, tools=None) -> list[int]:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=True,
            add_generation_prompt=generation_prompt,
            return_dict=True,
        )["input_ids"]

    def call(self, query: str) -> int:
        """The call the model generates: after the assistant header, up to its <|im_end|>."""
        prompt = self.ids(self._call[:1], generation_prompt=True)
        full = self.ids([self._call[0], tool_call_message(query)])
        return full.index(self.eos, len(prompt)) + 1 - len(prompt)

    def observation(self, text: str) -> int:
        """TRL's tool suffix for a result: the rendered tool turn and the next header, from the
        call's <|im_end|> on (GRPOTrainer._get_tool_suffix_ids)."""
        if text not in self._cache:
            before = self.ids(self._call)
            before = before[: len(before) - before[::-1].index(self.eos)]
            tool = {"role": "tool", "name": "execute_sql", "content": text}
            full = self.ids(self._call + [tool], generation_prompt=True)
            assert full[: len(before)] == before
            self._cache[text] = len(full) - len(before)
        return self._cache[text]

    def answer(self, sql: str) -> int:
        return len(self.tokenizer(sql, add_special_tokens=False)["input_ids"]) + 1

    def prompt_overhead(self, system_prompt: str) -> int:
        """The agent prompt's tokens beyond prepare's (whose length max_prompt_tokens bounds):
        AGENT_SYSTEM_PROMPT for prepare's system prompt, and the tool schema."""
        schema = "CREATE TABLE t (a int)"
        agent = build_messages(schema, "?", AGENT_SYSTEM_PROMPT)
        plain = build_messages(schema, "?", system_prompt)
        return len(self.ids(agent, True, tool_schemas())) - len(self.ids(plain, True))


def spider_questions(every: int) -> list[dict]:
    """Train questions whose gold names a table and whose database is here."""
    questions = json.loads((SPIDER / "train_spider.json").read_text())[::every]
    rows = []
    for q in questions:
        db = SPIDER / "database" / q["db_id"] / f"{q['db_id']}.sqlite"
        probe = probe_query(q["query"])
        if probe is not None and db.is_file():
            rows.append({"db": str(db), "gold": q["query"], "probe": probe})
    return rows


def measure(rows, environment: SQLEnvironment, counter: Counter) -> dict[str, dict]:
    """Per query kind: each question's observation, call + observation, and whole episode."""
    seen: dict[tuple[str, str], str] = {}

    def observe(db: str, query: str) -> str:
        if (db, query) not in seen:
            environment.reset(db_path=db)
            seen[db, query] = environment.execute_sql(query)
        return seen[db, query]

    kinds = {"probe": lambda r: r["probe"], "table": lambda r: r["probe"].rsplit(" LIMIT ", 1)[0]}
    kinds["gold"] = lambda r: r["gold"]
    out = {}
    for kind, query_of in kinds.items():
        lengths = {"observation": [], "call + observation": [], "call + observation + answer": []}
        for r in rows:
            query = query_of(r)
            obs = counter.observation(observe(r["db"], query))
            call = counter.call(normalize_sql_whitespace(query))
            answer = counter.answer(normalize_sql_whitespace(r["gold"]))
            lengths["observation"].append(obs)
            lengths["call + observation"].append(call + obs)
            lengths["call + observation + answer"].append(call + obs + answer)
        out[kind] = {name: sorted(values) for name, values in lengths.items()}
    out["answer"] = {
        "answer": sorted(counter.answer(normalize_sql_whitespace(r["gold"])) for r in rows)
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="qwen2.5-coder-3b-agent")
    parser.add_argument("--max-chars", type=int, nargs="*", help="default: the profile's")
    parser.add_argument("--every", type=int, default=1, help="every n-th train question")
    args = parser.parse_args()
    params = params_from_dict(compose_params(args.profile, [], conf_dir=REPO / "conf"))
    agent = params.grpo.agent
    counter = Counter()
    rows = spider_questions(args.every)
    print(
        f"{args.profile}: {len(rows)} train questions, max_rows {agent.max_rows}, "
        f"Qwen2.5 tokens as TRL counts them against max_completion_length"
    )
    for max_chars in args.max_chars or [agent.max_chars]:
        environment = SQLEnvironment(
            ExecLimits(timeout_s=params.grpo.reward_timeout_s),
            max_turns=agent.max_turns,  # each query starts an episode (reset): never refused
            max_rows=agent.max_rows,
            max_chars=max_chars,
        )
        print(f"\nmax_chars {max_chars}\n| query | tokens of | median | p90 | p99 | max |")
        print("|---|---|---|---|---|---|")
        for kind, table in measure(rows, environment, counter).items():
            for name, values in table.items():
                cells = " | ".join(str(quantile(values, q)) for _, q in QUANTILES)
                print(f"| {kind} | {name} | {cells} |")
    overhead = counter.prompt_overhead(params.prepare.system_prompt)
    print(
        f"\nprompt: the agent's system prompt and tool schema add {overhead} tokens to "
        f"prepare.max_prompt_tokens ({params.prepare.max_prompt_tokens})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
