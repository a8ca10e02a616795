"""Answer formats: how a model answers (grpo.rollout, saved with the model as
sqlrl_prompt.json's `rollout`; docs/rollouts.md), one module per format behind one interface
(sqlrl/formats/base.py's `Format`):

- sql.py: the query itself (the default);
- reasoning.py: <think>...</think> then <answer>...</answer>;
- agent.py: execute_sql calls (sql_environment.py, the tool; tool_loop.py, the inference
  loop) before the final answer.

Everything that depends on the format asks the format object found here by name
(`get_format`): evaluation, TextToSQL, the server, prepare, grpo_prompts and grpo. A new
format is a module with a `Format` subclass and its line below (or `register_format` at run
time; tests/formats/test_registry.py registers one of its own and evaluates with it). params.yaml's
grpo.rollout accepts the built-in names (sqlrl.params.ROLLOUTS, checked against this registry
by tests/formats/test_registry.py); a model folder's, any registered one.
"""

from __future__ import annotations

from sqlrl.formats.agent import AgentFormat
from sqlrl.formats.base import Format
from sqlrl.formats.reasoning import ReasoningFormat
from sqlrl.formats.sql import SqlFormat

__all__ = ["FORMATS", "Format", "get_format", "register_format", "unregister_format"]

FORMATS: dict[str, Format] = {}  # name -> format, in registration order


def register_format(answer_format: Format) -> Format:
    """Add a format under its name; a name already taken is refused (unregister it first)."""
    name = answer_format.name
    if not name or name in FORMATS:
        raise ValueError(f"cannot register an answer format named {name!r}: taken or empty")
    FORMATS[name] = answer_format
    return answer_format


def unregister_format(name: str) -> Format:
    """Remove a registered format (a test's own) and return it."""
    return FORMATS.pop(name)


def get_format(name: str) -> Format:
    """The format called `name` (grpo.rollout, sqlrl_prompt.json's `rollout`)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown answer format {name!r}: one of {', '.join(FORMATS)}") from None


register_format(SqlFormat())
register_format(ReasoningFormat())
register_format(AgentFormat())
