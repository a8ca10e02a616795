"""The prompt settings saved with a model (sqlrl/data/prompt_settings.py), which the server reads."""

from __future__ import annotations

import json

import pytest

from sqlrl.data.prompt_settings import (
    PROMPT_SETTINGS_FILE,
    PromptSettingsError,
    read_prompt_settings,
    write_prompt_settings,
)
from sqlrl.params import load_params


def test_saved_settings_read_back_and_a_damaged_file_stops_the_server_at_startup(tmp_path):
    """What sft writes reads back as it was; a hand-edited file with a wrong type, a missing
    field or broken JSON is refused naming the problem, not served with odd prompts."""
    params = load_params()
    path = write_prompt_settings(tmp_path, params.prepare, params.eval.schema_repair)
    assert path == tmp_path / PROMPT_SETTINGS_FILE
    prep = params.prepare
    assert read_prompt_settings(tmp_path) == {
        "schema_format": prep.schema_format,
        "sample_rows": prep.sample_rows,
        "max_prompt_tokens": prep.max_prompt_tokens,
        "system_prompt": prep.system_prompt,
        "mark_schema_mentions": prep.mark_schema_mentions,
        "schema_repair": params.eval.schema_repair,
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
