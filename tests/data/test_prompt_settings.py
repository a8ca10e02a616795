"""The prompt settings saved with a model (sqlrl/data/prompt_settings.py), which the server reads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sqlrl.data.prompt_settings import (
    PROMPT_SETTINGS_FILE,
    AnswerFormat,
    PromptSettings,
    PromptSettingsError,
    read_answer_format,
    read_prompt_settings,
    write_prompt_settings,
)
from tests.repo_tools import fixed_params


def test_saved_settings_read_back_and_a_damaged_file_stops_the_server_at_startup(tmp_path):
    """What sft writes reads back as it was; a hand-edited file with a wrong type, a missing
    field or broken JSON is refused naming the problem, not served with odd prompts."""
    # no setting at its default, so a field written or read back wrongly shows
    base = fixed_params().prepare
    prep = dataclasses.replace(
        base,
        schema_format="ddl",
        sample_rows=3,
        max_prompt_tokens=1500,
        system_prompt="Answer in SQLite.",
        mark_schema_mentions=True,
        column_descriptions=True,
        augment=dataclasses.replace(base.augment, copies=0),
    )
    grpo = fixed_params(
        "grpo.rollout=agent",
        "base.tokenizer=qwen2.5",
        "grpo.agent.max_turns=2",
        "grpo.agent.max_rows=3",
        "grpo.agent.max_chars=400",
        "grpo.reward_timeout_s=2.5",
    ).grpo
    path = write_prompt_settings(tmp_path, prep, False, grpo)
    assert path == tmp_path / PROMPT_SETTINGS_FILE
    assert read_prompt_settings(tmp_path) == {
        "schema_format": "ddl",
        "sample_rows": 3,
        "max_prompt_tokens": 1500,
        "system_prompt": "Answer in SQLite.",
        "mark_schema_mentions": True,
        "schema_repair": False,
        "column_descriptions": True,
        "rollout": "agent",
        "max_turns": 2,
        "max_rows": 3,
        "max_chars": 400,
        "tool_timeout_s": 2.5,
    }
    assert read_answer_format(tmp_path) == AnswerFormat("agent", 2, 3, 400, 2.5)
    saved = json.loads(path.read_text())
    for field, bad, why in [
        ("sample_rows", "3", "sample_rows must be of type int, got '3'"),
        ("mark_schema_mentions", 1, "mark_schema_mentions must be of type"),
        ("max_prompt_tokens", True, "max_prompt_tokens must be of type int"),
    ]:
        path.write_text(json.dumps({**saved, field: bad}))
        with pytest.raises(PromptSettingsError, match=why):
            read_prompt_settings(tmp_path)
    path.write_text(json.dumps({k: v for k, v in saved.items() if k != "schema_repair"}))
    with pytest.raises(PromptSettingsError, match="missing schema_repair"):
        read_prompt_settings(tmp_path)
    path.write_text("[1, 2]")
    with pytest.raises(PromptSettingsError, match="not a JSON object"):
        read_prompt_settings(tmp_path)
    path.write_text("{")
    with pytest.raises(PromptSettingsError, match="unreadable"):
        read_prompt_settings(tmp_path)


def test_the_default_format_writes_nothing_new_and_a_folder_without_it_answers_in_sql(tmp_path):
    """The sql format (the default) leaves sqlrl_prompt.json as it was before formats existed,
    and so does a change of the agent's bounds outside the agent format; such a file, an older
    one, or a folder with no file at all (models/base) means `sql`. An unknown format is refused
    with its name, before any question is asked."""
    params = fixed_params()
    path = write_prompt_settings(tmp_path, params.prepare, True, params.grpo)
    saved = json.loads(path.read_text())
    assert not set(saved) & {"rollout", "max_turns", "max_rows", "max_chars", "tool_timeout_s"}
    before = path.read_bytes()
    write_prompt_settings(
        tmp_path, params.prepare, True, fixed_params("grpo.agent.max_turns=2").grpo
    )
    assert path.read_bytes() == before
    assert read_answer_format(tmp_path).rollout == "sql"
    assert PromptSettings.for_model(tmp_path).answer_format == AnswerFormat()
    assert read_answer_format(tmp_path / "absent").rollout == "sql"

    reasoning = fixed_params("grpo.rollout=reasoning").grpo
    write_prompt_settings(tmp_path, params.prepare, True, reasoning)
    assert json.loads(path.read_text()) == {**saved, "rollout": "reasoning"}  # no agent bounds
    assert PromptSettings.for_model(tmp_path).rollout == "reasoning"

    path.write_text(json.dumps({**saved, "rollout": "chain"}))
    with pytest.raises(PromptSettingsError, match="unknown answer format rollout='chain'"):
        read_answer_format(tmp_path)
    with pytest.raises(PromptSettingsError, match="unknown answer format"):
        PromptSettings.for_model(tmp_path)
    path.write_text(json.dumps({**saved, "rollout": "agent", "max_turns": 0}))
    with pytest.raises(PromptSettingsError, match="max_turns must be > 0"):
        read_answer_format(tmp_path)
