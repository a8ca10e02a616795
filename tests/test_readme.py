"""The README's examples are true: each `t(QUESTION, db=DB)` line of its Python example is
followed by the SQL the committed default model really returns for it."""

from __future__ import annotations

import ast
import json
import re

import pytest

from tests.repo_tools import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def _examples() -> list[tuple[str, str, str]]:
    """(question, db, SQL shown) for each call in the README's Python block."""
    block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    lines = block.splitlines()
    examples = []
    for line, shown in zip(lines, lines[1:], strict=False):
        call = re.fullmatch(r't\((".*?"), db=(".*?")\)', line.strip())
        if call:
            sql = re.match(r"#\s*('.*?'|\".*?\")\s", shown + " ").group(1)
            examples.append((*(ast.literal_eval(g) for g in call.groups()), ast.literal_eval(sql)))
    return examples


def test_the_readme_has_examples_to_check():
    assert len(_examples()) >= 2


@pytest.mark.parametrize("question, db, sql", _examples())
def test_each_example_is_what_the_committed_model_predicted(question, db, sql):
    """data/predictions/final.jsonl holds the committed model's greedy answers to dev."""
    rows = [json.loads(line) for line in (REPO_ROOT / "data/predictions/final.jsonl").open()]
    predicted = [r["pred"] for r in rows if (r["question"], r["db_id"]) == (question, db)]
    assert predicted and predicted[0] == sql


@pytest.mark.parametrize("question, db, sql", _examples())
def test_each_example_is_what_the_model_answers(question, db, sql):
    """The Python API itself, where the pipeline's final model is here (`dvc repro`)."""
    model = REPO_ROOT / "models" / "final"
    if not (model / "config.json").is_file():
        pytest.skip("models/final is a pipeline output: run `dvc repro` to have it")
    from sqlrl.text_to_sql import TextToSQL

    assert TextToSQL(model, spider_dir=REPO_ROOT / "data/raw/spider")(question, db=db) == sql
