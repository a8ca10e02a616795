"""Answer formats (sqlrl/formats/): adding one is a module with a `Format` subclass and its
registry line. The format below is defined here, registered, and a model folder that records
it is evaluated by the real evaluation (sqlrl.eval.evaluate.evaluate_model) on Spider dev rows,
a scripted generator in place of the model; the built-in names agree with params'."""

from __future__ import annotations

import ast
import json
import re
from types import SimpleNamespace

import pytest

from sqlrl.data.prompt_settings import PromptSettings, read_answer_format, write_prompt_settings
from sqlrl.eval.evaluate import evaluate_model
from sqlrl.formats import FORMATS, Format, get_format, register_format, unregister_format
from sqlrl.params import ROLLOUTS, TOOL_ROLLOUTS
from sqlrl.sql.extract import extract_sql
from tests.repo_tools import REPO_ROOT, eval_params, fixed_params

BUILT_IN = tuple(FORMATS)  # before any test registers its own

MARKED_PROMPT = "Answer with one SQLite query between <<< and >>>."
_MARKED = re.compile(r"<<<(.*?)>>>\s*\Z", re.S)


class MarkedFormat(Format):
    """A format of this test module: the query between <<< and >>> at the end of the
    completion; anything else is no answer."""

    name = "marked"
    system_prompt = MARKED_PROMPT

    def extract(self, completion) -> str:
        match = _MARKED.search(completion)
        return extract_sql(match.group(1)) if match else ""


@pytest.fixture
def marked():
    """MarkedFormat registered for one test, and unregistered after it."""
    answer_format = register_format(MarkedFormat())
    yield answer_format
    unregister_format(answer_format.name)
    assert "marked" not in FORMATS


class ScriptedModel:
    """Answers each prompt from a table keyed by the question; records every prompt."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.prompts = []

    def generate(self, prompts):
        self.prompts += prompts
        return [self.answers[json.loads(p)[-1]["content"]] for p in prompts]


def _render(messages):
    return json.dumps(messages)


def test_a_format_registered_in_a_test_module_runs_through_evaluation(
    marked,
    singer_rows,
    spider_dir,
    tmp_path,
):
    path, rows = singer_rows  # four concert_singer dev rows as prepare writes them
    golds = [r["gold"] for r in rows]
    wrong = "SELECT name FROM singer WHERE 1 = 0"
    said = [  # what the model answers -> the SQL a user expects scored, and its EX
        (f"<<<{golds[0]}>>>", golds[0], 1),
        (golds[1], "", 0),  # no marker: no answer, scored wrong
        (f"draft: SELECT nope\n<<<\n```sql\n{golds[2]};\n```\n>>>", golds[2], 1),
        (f"<<<{wrong}>>>", wrong, 0),
    ]
    model = ScriptedModel(
        {r["prompt"][-1]["content"]: text for r, (text, _, _) in zip(rows, said, strict=True)}
    )
    folder = tmp_path / "model"
    folder.mkdir()
    write_prompt_settings(folder, fixed_params().prepare, False, SimpleNamespace(rollout="marked"))
    assert json.loads((folder / "sqlrl_prompt.json").read_text())["rollout"] == "marked"
    assert read_answer_format(folder).rollout == "marked"

    metrics, predictions = evaluate_model(
        folder,
        eval_params(),
        0,
        {"dev": path},
        generator=model,
        render=_render,
        spider_dir=spider_dir,
    )

    asked = [json.loads(p) for p in model.prompts]
    assert len(asked) == 4 and all(
        p[0] == {"role": "system", "content": MARKED_PROMPT} for p in asked
    )
    dev = predictions["dev"]
    assert [p["pred"] for p in dev] == [sql for _, sql, _ in said]
    assert [p["ex"] for p in dev] == [ex for _, _, ex in said]
    assert [p["output"] for p in dev] == [text for text, _, _ in said]
    assert metrics["dev"]["ex"] == pytest.approx(0.5) and metrics["dev"]["n"] == 4
    assert metrics["dev"]["rollout"] == "marked"  # the format reports itself
    assert all("trace" not in p for p in dev)  # a plain format has no tool trace


def test_a_registered_format_is_a_model_folder_s_format_everywhere(marked):
    settings = PromptSettings("compact", 0, "S", rollout="marked")
    assert settings.answer_format.rollout == "marked"
    assert settings.record()["rollout"] == "marked"  # the format's recorded fields only
    assert "max_turns" not in settings.record()
    assert get_format("marked") is marked
    assert marked.prompt([{"role": "user", "content": "Q"}])[0]["content"] == MARKED_PROMPT
    with pytest.raises(ValueError, match="taken"):
        register_format(MarkedFormat())


def test_unknown_formats_are_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match="unknown answer format 'nope': one of sql, reasoning"):
        get_format("nope")
    with pytest.raises(ValueError, match="rollout must be one of"):
        PromptSettings("compact", 0, "S", rollout="nope")


def test_params_declares_the_built_in_formats():
    """params.yaml's grpo.rollout accepts the registry's built-in names, and the formats whose
    rollouts call tools are the ones params checks the tool's needs for."""
    assert ROLLOUTS == BUILT_IN == ("sql", "reasoning", "agent")
    assert TOOL_ROLLOUTS == tuple(n for n in BUILT_IN if get_format(n).calls_tools)


FORMAT_NAMES = {"agent", "reasoning"}


def test_format_names_are_compared_only_inside_the_formats_package():
    """No module outside sqlrl/formats/ decides by a format's name: they ask the format
    (params may only declare the names)."""
    found = []
    for path in sorted((REPO_ROOT / "sqlrl").rglob("*.py")):
        relative = path.relative_to(REPO_ROOT).as_posix()
        if relative.startswith("sqlrl/formats/") or relative == "sqlrl/params.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in FORMAT_NAMES:
                found.append(f"{relative}:{node.lineno}")
    assert not found, found


def test_only_training_imports_sqlrl_train():
    """Evaluation, serving, data and the Python API import nothing of sqlrl.train."""
    found = []
    for path in sorted((REPO_ROOT / "sqlrl").rglob("*.py")):
        relative = path.relative_to(REPO_ROOT).as_posix()
        if relative.startswith("sqlrl/train/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "sqlrl.train" or n.startswith("sqlrl.train.") for n in names):
                found.append(f"{relative}:{node.lineno}")
    assert not found, found
