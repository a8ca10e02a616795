"""The prompts the generation tests (test_generate.py, test_constrained.py) ask the tiny model:
questions of different lengths, so that batches are left-padded."""

from __future__ import annotations

import pytest

from sqlrl.data.prompts import build_messages, render_prompt

QUESTIONS = [
    "How many singers?",
    "List every stadium name ordered by capacity descending.",
    "Name?",
    "What are the names and countries of singers older than 40 who sang in "
    "a concert in 2014 or 2015?",
    "Count concerts.",
]


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tokenizer, _ = tiny
    return [
        render_prompt(tokenizer, build_messages("singer | name, age", q, "Answer in SQL."))
        for q in QUESTIONS
    ]
