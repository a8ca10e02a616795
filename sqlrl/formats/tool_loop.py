"""The agent format at inference: the tool loop TRL 1.16's GRPOTrainer runs in training
(`_tool_call_loop`), run over a `Generator` (sqlrl/model/generate.py), so evaluation,
TextToSQL and the server ask an agent model the way it was trained (docs/rollouts.md). The
agent format (sqlrl/formats/agent.py) hands it out as its inference loop.

Each turn, every episode still going is rendered with the tokenizer's chat template and the
tool's schema (`render_agent_prompt`: TRL's `apply_chat_template(..., tools=...,
add_generation_prompt=True)`), and the generator writes one assistant turn for all of them in
one batched call. The turn is parsed by TRL's own `parse_response` with the response template
TRL sets on the tokenizer (`add_response_schema`): the same parser, the same fallback (a
malformed call is plain text). Each call runs through a `SQLEnvironment` with the model's
bounds (read-only sandbox, bounded observation); its result, or TRL's `{'error': ...}` text
for a call TRL's dispatch would fail (an unknown tool, bad arguments), comes back as a tool
message, and the conversation is rendered again. An episode ends at a turn with no tool call
(its content is the answer) or after `max_turns` rounds of calls, as TRL's
`max_tool_calling_iterations`: a turn that still calls the tool then has no answer.

One difference from training, which this cannot avoid: TRL appends the generated tokens
themselves to the next turn's prompt, while a Generator returns text, so the assistant's call
is re-rendered by the chat template (SFT's trajectories were rendered the same way).

Training never imports this module; it runs TRL's own loop over the same environment.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sqlrl.formats.base import Asked
from sqlrl.formats.sql_environment import tool_schemas  # the schema training rendered

TOOL_NAME = "execute_sql"


@dataclass
class Episode:
    """One question's conversation with the tool, and what it came to."""

    messages: list[dict]  # the prompt, then every assistant turn and tool result
    db_path: str | None
    answer: str | None = None  # the last turn's content when it calls no tool, else None
    output: str = ""  # the last turn's text as generated
    probes: list[dict] = field(default_factory=list)  # {"query", "observation"} per call
    turns: int = 0  # assistant turns generated
    calls: int = 0  # tool calls made
    failed_calls: int = 0  # errors, refusals, calls past the limit, malformed calls
    done: bool = False

    def trace(self, final_sql: str) -> dict:
        """What the model looked at and what it answered: the probes (each query and the
        observation it got) and the final SQL ("" when the episode ended without one)."""
        return {"probes": [dict(p) for p in self.probes], "final_sql": final_sql}


def render_agent_prompt(tokenizer, messages: list[dict], tools: list[dict]) -> str:
    """The prompt text of the next assistant turn, rendered as TRL renders an environment's
    prompt: the chat template with the tools, plus the assistant header."""
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )


def with_response_parser(tokenizer):
    """The tokenizer with the response template TRL's GRPOTrainer sets for tool calls (its
    `add_response_schema`, where the tokenizer has none), so `parse_response` reads calls as
    training did. A chat template TRL cannot parse calls of is refused with why."""
    from trl.chat_template_utils import add_response_schema

    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return tokenizer
    try:
        return add_response_schema(tokenizer)
    except ValueError as exc:
        raise ValueError(
            f"this model's chat template cannot call tools, so it cannot answer in the agent "
            f"format: {exc}"
        ) from None


def parse_turn(tokenizer, text: str, prompt: str, tools: list[dict]) -> dict:
    """One generated turn as TRL parses it (`trl.chat_template_utils.parse_response` on the
    turn's tokens after the prompt's): an assistant message, with `tool_calls` when it calls."""
    from trl.chat_template_utils import parse_response

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    prefix = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    try:
        return parse_response(tokenizer, ids, prefix=prefix, tools=tools)
    except Exception:  # noqa: BLE001 - TRL falls back on ValueError/TypeError; one odd turn
        return {"role": "assistant", "content": text}  # must not stop an evaluation either


def call_tool(environment, call) -> tuple[str, str, bool]:
    """(tool name, result text, failed) of one parsed call, dispatched as TRL dispatches it:
    a call TRL would fail (not a function, an unknown tool, bad arguments) answers
    `{'error': ...}`, as the model saw in training, and counts as failed."""
    if not isinstance(call, dict) or call.get("type") != "function":
        kind = call.get("type") if isinstance(call, dict) else type(call).__name__
        name = call.get("name", "unknown") if isinstance(call, dict) else "unknown"
        return str(name), str({"error": f"Unsupported tool call type: {kind}"}), True
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    failed_before = environment.stats.failed_calls
    try:
        if name != TOOL_NAME:
            raise ValueError(f"Tool {name} not found.")
        result = environment.execute_sql(**function.get("arguments", {}))
    except Exception as exc:  # noqa: BLE001 - TRL turns every tool exception into a result
        return str(name), str({"error": str(exc)}), True
    return name, str(result), environment.stats.failed_calls > failed_before


def call_query(call) -> str:
    """The query a parsed call asked for ("" when it names none), for the trace."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    query = arguments.get("query") if isinstance(arguments, dict) else None
    return "" if query is None else str(query)


class AgentLoop:
    """Runs agent episodes over a Generator (see the module docstring)."""

    def __init__(self, generator, tokenizer, answer_format):
        """`answer_format`: the model's (sqlrl.data.prompt_settings.AnswerFormat): the tool's
        bounds it was trained with."""
        from sqlrl.sql.executor import ExecLimits

        self.generator = generator
        self.tokenizer = with_response_parser(tokenizer)
        self.format = answer_format
        self.tools = tool_schemas()
        self.limits = ExecLimits(timeout_s=answer_format.tool_timeout_s)

    def run(
        self,
        prompts: list[list[dict]],
        db_paths: list[str | None],
        *,
        n: int = 1,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> list[list[Episode]]:
        """`n` episodes per prompt (chat messages in the agent's format), each on its
        question's database: greedy at temperature 0 (n must then be 1), else sampled at
        `temperature` (the first turn draws a prompt's n samples together; later turns one
        each, at seed + turn)."""
        from sqlrl.params import check_sampling

        check_sampling(n, temperature)
        if len(prompts) != len(db_paths):
            raise ValueError(f"{len(prompts)} prompts but {len(db_paths)} databases")
        groups = [
            [Episode(list(messages), db_path) for _ in range(n)]
            for messages, db_path in zip(prompts, db_paths, strict=True)
        ]
        environments = {id(e): self._environment(e) for group in groups for e in group}
        for turn in range(self.format.max_turns + 1):
            active = [e for group in groups for e in group if not e.done]
            if not active:
                break
            rendered = [render_agent_prompt(self.tokenizer, e.messages, self.tools) for e in active]
            texts = self._generate(rendered, turn, n, temperature, seed)
            for episode, prompt, text in zip(active, rendered, texts, strict=True):
                last = turn == self.format.max_turns
                self._step(episode, environments[id(episode)], prompt, text, last)
        return groups

    def first_prompt(self, messages: list[dict]) -> str:
        """The first turn's prompt text (the tool's schema in it), as a length check counts it."""
        return render_agent_prompt(self.tokenizer, messages, self.tools)

    def ask(self, prompts, db_paths, *, n=1, temperature=0.0, seed=0) -> list[Asked]:
        """`run`'s episodes as the inference loops' answers: one Asked per prompt, each
        episode's answer ("" without one) with the episode behind it."""
        groups = self.run(prompts, db_paths, n=n, temperature=temperature, seed=seed)
        return [Asked([e.answer or "" for e in group], group) for group in groups]

    async def ask_async(
        self, messages: list[dict], db_path, *, prompt: str, n: int, temperature: float, seed: int
    ) -> Asked:
        """One question for the server: the synchronous loop in a worker thread, each turn's
        generation handed to the event loop by the server's generator (its batching); the
        `prompt` was checked already."""
        [asked] = await asyncio.to_thread(
            self.ask, [messages], [db_path], n=n, temperature=temperature, seed=seed
        )
        return asked

    def _environment(self, episode: Episode):
        from sqlrl.formats.sql_environment import SQLEnvironment

        environment = SQLEnvironment(
            self.limits, self.format.max_turns, self.format.max_rows, self.format.max_chars
        )
        environment.reset(db_path=episode.db_path)
        return environment

    def _generate(self, rendered, turn, n, temperature, seed) -> list[str]:
        """One assistant turn for every active episode, in one call: greedy, or sampled (on
        the first turn a prompt's n episodes are its n samples)."""
        if temperature <= 0.0:
            texts = self.generator.generate(rendered)
        elif turn == 0:
            firsts = rendered[::n]  # every episode is active on the first turn
            samples = self.generator.sample(firsts, n, temperature, seed)
            texts = [text for group in samples for text in group]
        else:
            texts = [s[0] for s in self.generator.sample(rendered, 1, temperature, seed + turn)]
        if len(texts) != len(rendered):
            raise RuntimeError(
                f"the generator returned {len(texts)} turns for {len(rendered)} prompts"
            )
        return texts

    def _step(self, episode: Episode, environment, prompt: str, text: str, last: bool) -> None:
        """Take one generated turn: an answer ends the episode; calls run and their results
        are appended, unless the turns are spent (then it ends with no answer)."""
        message = parse_turn(self.tokenizer, text, prompt, self.tools)
        episode.turns += 1
        episode.output = text
        episode.messages.append(message)
        calls = message.get("tool_calls")
        if not calls:
            episode.answer = message.get("content") or ""
            episode.done = True
            return
        if last:
            episode.done = True
            return
        for call in calls:
            name, result, failed = call_tool(environment, call)
            episode.calls += 1
            episode.failed_calls += failed
            episode.probes.append({"query": call_query(call), "observation": result})
            episode.messages.append({"role": "tool", "name": name, "content": result})


def agent_stats(episodes: list[Episode]) -> dict:
    """The agent's inference metrics over episodes: tool calls and assistant turns per
    episode, the share of failed calls, the share of episodes without a final answer."""
    count = len(episodes)
    calls = sum(e.calls for e in episodes)
    return {
        "episodes": count,
        "tool_calls_per_episode": round(calls / count, 4) if count else None,
        "turns_per_episode": round(sum(e.turns for e in episodes) / count, 4) if count else None,
        "failed_tool_call_share": round(sum(e.failed_calls for e in episodes) / calls, 4)
        if calls
        else 0.0,
        "no_answer_share": round(sum(e.answer is None for e in episodes) / count, 4)
        if count
        else None,
    }
