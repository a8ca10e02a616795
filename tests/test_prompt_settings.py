"""The prompt settings saved with a model (sqlrl/data/prompt_settings.py), which the server reads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sqlrl.data.prompt_settings import (
    PROMPT_SETTINGS_FILE,
    PromptSettingsError,
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
    path = write_prompt_settings(tmp_path, prep, False)
    assert path == tmp_path / PROMPT_SETTINGS_FILE
    assert read_prompt_settings(tmp_path) == {
        "schema_format": "ddl",
        "sample_rows": 3,
        "max_prompt_tokens": 1500,
        "system_prompt": "Answer in SQLite.",
        "mark_schema_mentions": True,
        "schema_repair": False,
        "column_descriptions": True,
    }
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
