"""What the server asks the model: the request input (sqlrl/request_input.py) builds the prompts
training and evaluation saw, from the prompt settings saved with the model
(sqlrl/serve/config.py), never from the workspace's params.yaml."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient  # a hard dependency: never skip these tests

from sqlrl.data.prompt_settings import PromptSettingsError, write_prompt_settings
from sqlrl.request_input import RequestInput
from sqlrl.serve import PromptSettings, create_app, schema_from_ddl
from tests.repo_tools import SPIDER_DIR
from tests.serve_helpers import (
    CONCERT_DDL,
    LOCAL_URL,
    SETTINGS,
    Q,
    ScriptedGenerator,
    save_prompt_settings,
    scripted_app,
    serve_config,
)


def test_ddl_prompt_equals_the_training_prompt():
    builder = RequestInput(SETTINGS, SPIDER_DIR)
    assert builder.messages("Q?", ddl=CONCERT_DDL) == builder.messages("Q?", db_id="concert_singer")
    ddl_settings = PromptSettings("ddl", 0, "sys")
    ddl_builder = RequestInput(ddl_settings, SPIDER_DIR)
    schema = schema_from_ddl(CONCERT_DDL)
    assert [t.name for t in schema.tables] == ["stadium", "singer", "concert", "singer_in_concert"]
    singer = schema.tables[1]
    assert [(c.name, c.type, c.is_primary) for c in singer.columns][:2] == [
        ("Singer_ID", "number", True),
        ("Name", "text", False),
    ]
    assert singer.columns[-1].type == "boolean"
    assert {(f.table, f.column, f.ref_table, f.ref_column) for f in schema.foreign_keys} == {
        ("concert", "Stadium_ID", "stadium", "Stadium_ID"),
        ("singer_in_concert", "concert_ID", "concert", "concert_ID"),
        ("singer_in_concert", "Singer_ID", "singer", "Singer_ID"),
    }
    text = ddl_builder.messages("Q?", ddl=CONCERT_DDL)[1]["content"]
    assert "PRIMARY KEY (concert_ID, Singer_ID)" in text
    assert "FOREIGN KEY (Singer_ID) REFERENCES singer(Singer_ID)" in text


def test_served_prompts_are_the_prompts_the_model_was_evaluated_on(prepared_dir, tmp_path):
    """What the sft stage saves with the model is what the server builds its prompts from."""
    from sqlrl.jsonio import read_jsonl
    from tests.repo_tools import fixed_params

    params = fixed_params(  # the prompt format prepared_dir was written with
        "prepare.schema_format=compact",
        "prepare.sample_rows=0",
        "prepare.mark_schema_mentions=true",
        "prepare.max_prompt_tokens=0",
    )
    write_prompt_settings(tmp_path, params.prepare, params.eval.schema_repair)
    settings = PromptSettings.for_model(tmp_path)
    prep = params.prepare
    assert settings == PromptSettings(
        prep.schema_format,
        prep.sample_rows,
        prep.system_prompt,
        prep.mark_schema_mentions,
        params.eval.schema_repair,
        prep.max_prompt_tokens,
    )
    rows = [r for r in read_jsonl(prepared_dir / "dev.jsonl")[:50] if r.get("prompt")]
    builder = RequestInput(settings, SPIDER_DIR)
    for row in rows[:5]:
        assert builder.messages(row["question"], db_id=row["db_id"]) == row["prompt"]


def test_prompts_follow_the_model_folder_not_the_workspace_params(trained, tokenizer, tmp_path):
    """A DDL-trained model is served DDL prompts although params.yaml (cpu profile) says
    compact: the settings come from the model's sqlrl_prompt.json."""
    from sqlrl.params import load_params

    assert load_params().prepare.schema_format == "compact"
    save_prompt_settings(tmp_path, PromptSettings("ddl", 2, "DDL system prompt."))
    gen = ScriptedGenerator()
    with TestClient(
        scripted_app(tmp_path, tokenizer, gen, prompt_settings=None), base_url=LOCAL_URL
    ) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 200, r.text
        prompt = c.get("/health").json()["prompt"]
    assert (prompt["schema_format"], prompt["sample_rows"]) == ("ddl", 2)
    assert "CREATE TABLE singer (" in gen.prompts[0] and "DDL system prompt." in gen.prompts[0]
    assert "/* 2 example rows from singer:" in gen.prompts[0]


def test_overrides_replace_only_their_own_setting(trained, tokenizer, tmp_path):
    """Giving the three historical overrides keeps the model's schema-mention marking and
    schema repair (they used to be dropped silently)."""
    save_prompt_settings(
        tmp_path, PromptSettings("ddl", 3, "sys", mark_schema_mentions=True, schema_repair=True)
    )
    memorised = ScriptedGenerator(text="SELECT count(*) FROM performance")
    app = scripted_app(
        tmp_path,
        tokenizer,
        memorised,
        prompt_settings=None,
        schema_format="compact",
        sample_rows=0,
        system_prompt="Answer in SQL.",
    )
    with TestClient(app, base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        prompt = c.get("/health").json()["prompt"]
    assert prompt == {
        "schema_format": "compact",
        "sample_rows": 0,
        "system_prompt": "Answer in SQL.",
        "mark_schema_mentions": True,
        "schema_repair": True,
        "max_prompt_tokens": 0,
        "column_descriptions": False,  # false is left out of the file and read back as such
    }
    assert r.json()["sql"] == "SELECT COUNT(*) FROM singer"  # repaired, as in evaluation
    assert "Schema mentions: singer." in memorised.prompts[0]
    assert "singer | Singer_ID" in memorised.prompts[0]  # compact, as overridden


def test_a_model_without_prompt_settings_does_not_start(trained, tokenizer, tmp_path, capsys):
    """No silent fallback to params.yaml: the error names the file and the flags to give;
    with every setting given, the folder needs none."""
    import sqlrl.serve as serve

    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(PromptSettingsError, match="sqlrl_prompt.json is missing") as error:
        create_app(serve_config(bare))
    assert "dvc repro" in str(error.value)
    assert (
        "--schema-format, --sample-rows, --system-prompt, --mark-schema-mentions, "
        "--schema-repair, --sample-rows-token-budget" in str(error.value)
    )
    assert serve.main(["--model", str(bare), "--schema-format", "ddl"]) == 2
    assert "sqlrl_prompt.json is missing" in capsys.readouterr().err
    every = dict(
        schema_format="ddl",
        sample_rows=1,
        system_prompt="s",
        mark_schema_mentions=False,
        schema_repair=True,
        sample_rows_token_budget=0,
    )
    with TestClient(
        scripted_app(bare, tokenizer, ScriptedGenerator(), prompt_settings=None, **every),
        base_url=LOCAL_URL,
    ) as c:
        assert c.get("/health").json()["prompt"] == {
            "schema_format": "ddl",
            "sample_rows": 1,
            "system_prompt": "s",
            "mark_schema_mentions": False,
            "schema_repair": True,
            "max_prompt_tokens": 0,
            "column_descriptions": False,  # optional: its default
        }
