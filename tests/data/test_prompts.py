"""The prompt builder: both schema formats, golden examples from real Spider databases."""

from __future__ import annotations

import sqlite3

import pytest

from sqlrl.data.prompts import (
    build_messages,
    compact_schema,
    completion_message,
    ddl_schema,
    normalize_sql_whitespace,
    quote_identifier,
    serialize_schema,
)
from sqlrl.data.spider import database_path, load_schemas


@pytest.fixture(scope="module")
def schemas(spider_dir):
    return load_schemas(spider_dir / "tables.json")


def test_compact_schema_golden_concert_singer(schemas):
    assert compact_schema(schemas["concert_singer"]) == (
        "stadium | Stadium_ID, Location, Name, Capacity, Highest, Lowest, Average | "
        "singer | Singer_ID, Name, Country, Song_Name, Song_release_year, Age, Is_male | "
        "concert | concert_ID, concert_Name, Theme, Stadium_ID, Year | "
        "singer_in_concert | concert_ID, Singer_ID"
    )


def test_ddl_schema_golden_perpetrator_quotes_and_keys(schemas):
    assert (
        ddl_schema(schemas["perpetrator"])
        == """\
CREATE TABLE perpetrator (
  Perpetrator_ID NUMBER,
  People_ID NUMBER,
  Date TEXT,
  Year NUMBER,
  Location TEXT,
  Country TEXT,
  Killed NUMBER,
  Injured NUMBER,
  PRIMARY KEY (Perpetrator_ID),
  FOREIGN KEY (People_ID) REFERENCES people(People_ID)
);

CREATE TABLE people (
  People_ID NUMBER,
  Name TEXT,
  Height NUMBER,
  Weight NUMBER,
  "Home Town" TEXT,
  PRIMARY KEY (People_ID)
);"""
    )


def test_ddl_sample_rows_come_from_the_database(schemas, spider_dir):
    text = ddl_schema(schemas["concert_singer"], database_path(spider_dir, "concert_singer"), 2)
    assert (
        "/* 2 example rows from singer:\n1, 'Joe Sharp', 'Netherlands', 'You', '1992', 52, 'F'"
        in text
    )
    assert text.count("example rows from") == 4


def test_ddl_sample_rows_without_database_is_a_clear_error(schemas):
    with pytest.raises(ValueError, match="concert_singer: sample rows need the database"):
        ddl_schema(schemas["concert_singer"], None, 3)


def test_serialize_schema_rejects_unknown_format(schemas):
    with pytest.raises(ValueError, match="unknown schema format 'xml'"):
        serialize_schema(schemas["concert_singer"], "xml")


def test_messages_are_system_then_user_with_schema_and_question(schemas):
    schema = compact_schema(schemas["concert_singer"])
    messages = build_messages(schema, "  How many\tsingers do we have? ", "SYS")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == "SYS"
    assert messages[1]["content"] == (
        f"Database schema:\n{schema}\n\nQuestion: How many singers do we have?"
    )


def test_messages_refuse_empty_question_or_schema():
    with pytest.raises(ValueError, match="question is empty"):
        build_messages("t | a", " \n ", "SYS")
    with pytest.raises(ValueError, match="schema is empty"):
        build_messages("  ", "How many?", "SYS")


def test_odd_unicode_question_survives_unchanged_apart_from_whitespace():
    question = "Which café’s name has “ü” – or 東京?"
    assert build_messages("t | a", question, "S")[1]["content"].endswith(question)


def test_completion_collapses_whitespace_outside_literals_only():
    sql = "SELECT name ,  age FROM head WHERE name  =  'Ann  Lee'  AND  x = \"a  b\""
    assert normalize_sql_whitespace(sql) == (
        "SELECT name , age FROM head WHERE name = 'Ann  Lee' AND x = \"a  b\""
    )
    assert completion_message("SELECT  1") == [{"role": "assistant", "content": "SELECT 1"}]


def test_quote_identifier():
    assert quote_identifier("Home_Town") == "Home_Town"
    assert quote_identifier("Home Town") == '"Home Town"'
    assert quote_identifier('a"b') == '"a""b"'


def test_prompts_render_as_qwen25_sees_them_and_the_scratch_model_matches():
    """The rendered prompt is Qwen2.5's ChatML (its real tokenizer, offline), ending in the
    assistant header the model continues; the from-scratch model's template renders the same
    text, so both profiles train and serve on one prompt format."""
    from sqlrl.data.prompts import render_prompt
    from sqlrl.model.modeling import to_transformers_tokenizer, train_tokenizer
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    messages = build_messages("t | a", "Q?", "S")
    qwen = render_prompt(build_qwen25_tokenizer(), messages)
    assert qwen == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n"
        "Database schema:\nt | a\n\nQuestion: Q?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    scratch = to_transformers_tokenizer(train_tokenizer(["SELECT a FROM t"] * 10, 300))
    assert render_prompt(scratch, messages) == qwen


@pytest.mark.parametrize("rollout", ["sql", "reasoning"])
def test_a_requests_three_schema_sources_get_the_training_prompt(schemas, spider_dir, rollout):
    """A request's prompt (sqlrl/request_input.py) is the one prompt builder's: by db_id, as
    DDL, or as the schema text training serialised, the same messages as prepare's
    PromptFactory, in the model's answer format; input it cannot use is an InputError."""
    from sqlrl.data.prompt_settings import PromptSettings
    from sqlrl.data.prompts import PromptFactory
    from sqlrl.formats import get_format
    from sqlrl.request_input import InputError, RequestInput

    settings = PromptSettings("compact", 0, "Write SQLite.", rollout=rollout)
    question = "How many  singers are there?"
    factory = PromptFactory(settings, schemas, spider_dir)
    trained = get_format(rollout).prompt(factory.messages("concert_singer", question))
    request = RequestInput(settings, spider_dir)
    db = sqlite3.connect(database_path(spider_dir, "concert_singer"))
    try:  # concert_singer's CREATE TABLE statements, from its SQLite file
        ddl = ";\n".join(
            r[0] for r in db.execute("SELECT sql FROM sqlite_master WHERE type = 'table'")
        )
    finally:
        db.close()
    text = factory.schema_text("concert_singer")
    assert request.messages(question, db_id="concert_singer") == trained
    assert request.messages(question, ddl=ddl) == trained
    assert request.messages(question, schema_str=text) == trained
    assert (
        trained[1]["content"]
        == f"Database schema:\n{text}\n\nQuestion: How many singers are there?"
    )
    with pytest.raises(InputError, match="the schema is empty") as caught:
        request.messages(question, schema_str="  ")
    assert (caught.value.status, caught.value.param) == (422, None)
