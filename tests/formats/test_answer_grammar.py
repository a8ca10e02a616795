"""The answer formats' grammars (eval.constrained, grpo.constrained; docs/grammar.md): the
`sql` format's answer is the query grammar itself; the `reasoning` format's holds only its
<answer> span to the database's names, its thinking free."""

from __future__ import annotations

import json

import pytest

from sqlrl.data.spider import load_schemas
from sqlrl.formats import get_format
from sqlrl.formats.reasoning import reasoning_completion
from sqlrl.sql.grammar import accepts, checked_grammar_text, grammar_text, matcher_for
from tests.repo_tools import SPIDER_DIR

pytest.importorskip("xgrammar")

REASONING = get_format("reasoning").answer_grammar


@pytest.fixture(scope="module")
def schemas():
    return load_schemas(SPIDER_DIR / "tables.json")


def test_the_sql_answer_is_the_query(schemas):
    schema = schemas["concert_singer"]
    assert get_format("sql").answer_grammar(grammar_text(schema)) == grammar_text(schema)


def test_reasoning_answers_hold_only_the_answer_span_to_the_schema(schemas):
    matcher = matcher_for(schemas["concert_singer"], REASONING)
    free = "<think>FROM nosuch WHERE x < 3, <answer>draft</answer>?</think>\n"
    cases = {
        reasoning_completion("SELECT count(*) FROM singer")[0]["content"]: True,
        free + "<answer>SELECT Name FROM singer</answer>": True,  # any thinking
        free + "<answer>\nSELECT name FROM singer;\n</answer>\n": True,
        "<think>x</think><answer>SELECT name FROM nosuch</answer>": False,  # absent table
        "<think>x</think><answer>SELECT name FROM singer</answer> and more": False,
        "<answer>SELECT name FROM singer</answer>": False,  # no thinking first
        "SELECT name FROM singer": False,
    }
    assert {text: accepts(text, matcher) for text in cases} == cases


def test_every_dev_gold_in_the_reasoning_shape_is_accepted(schemas):
    """The SFT turns the reasoning format trains on, for Spider dev's gold: the grammar accepts
    them all (the query grammar's own coverage is tests/sql/test_grammar.py's)."""
    dev = json.loads((SPIDER_DIR / "dev.json").read_text())[:200]
    matchers = {}
    refused = []
    for item in dev:
        db = item["db_id"]
        matchers.setdefault(db, matcher_for(schemas[db], REASONING))
        text = reasoning_completion(item["query"])[0]["content"]
        if not accepts(text, matchers[db]):
            refused.append(text)
    assert refused == []


def test_vllm_reads_the_reasoning_grammar_as_ebnf(schemas):
    """vLLM picks Lark or EBNF by whether a line has `::=` (grammar_is_likely_lark): the
    composed text is EBNF to it, and xgrammar reads it (checked_grammar_text)."""
    text = checked_grammar_text(schemas["concert_singer"], REASONING)
    assert "TagDispatch" in text and "sql_root ::=" in text
    assert any("::=" in line for line in text.splitlines() if not line.startswith("#"))
