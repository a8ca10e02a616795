"""The model's turns written in advance, for tests of the agent format at inference (a random
model writes no tool call): through the Generator protocol both backends implement, in
evaluation (tests/formats/test_agent_inference.py) and in the server (tests/serve/test_agent.py).
"""

from __future__ import annotations

import json

SINGERS = "How many singers do we have?"  # concert_singer; `SELECT count(*) FROM singer` is 6


def call(query: str, name: str = "execute_sql") -> str:
    """A Qwen2.5 tool-call turn, as the model writes it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': {'query': query}})}\n</tool_call>"


class ScriptedGenerator:
    """The Generator protocol with the model's turns written in advance: `script(prompt,
    turn)` gives the text for a prompt whose conversation has had `turn` tool results. It
    records every batch it was asked for."""

    def __init__(self, script):
        self.script = script
        self.batches: list[list[str]] = []

    def generate(self, prompts):
        self.batches.append(list(prompts))
        return [self.script(p, p.count("<tool_response>")) for p in prompts]

    def sample(self, prompts, n, temperature, seed):
        self.batches.append(list(prompts))
        return [[self.script(p, p.count("<tool_response>"), i) for i in range(n)] for p in prompts]
