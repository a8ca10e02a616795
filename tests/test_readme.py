"""The README's examples are true: each `t(QUESTION, db=DB)` line of its Python example is
followed by the SQL the committed default model really returns for it.

They are checked against the committed results, not against what a local `dvc repro` wrote:
training and inference round differently on each kind of CPU (AVX2, AVX-512, AMX with bf16),
so a run elsewhere than the committed one's AMX Xeon yields a slightly different model whose
answers may differ, and the README describes the committed one."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess

import pytest

from tests.repo_tools import (
    REPO_ROOT,
    committed_out_md5,
    committed_text,
    run_cli,
    workspace_out_md5,
)

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
FINAL = "models/final"


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


@functools.cache
def _committed_predictions() -> tuple[dict, ...]:
    text = committed_text("data/predictions/final.jsonl")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@functools.cache
def _final_md5s() -> tuple[str | None, str | None]:
    """(models/final's md5 as DVC computes it here, the md5 the committed dvc.lock records)."""
    return workspace_out_md5(FINAL), committed_out_md5(FINAL)


def test_the_readme_has_examples_to_check():
    assert len(_examples()) >= 2


@pytest.mark.parametrize("question, db, sql", _examples())
def test_each_example_is_what_the_committed_model_predicted(question, db, sql):
    """data/predictions/final.jsonl as committed (`git show HEAD:...`) holds the committed
    model's greedy answers to dev; a `dvc repro` here rewrites the working tree's copy, so the
    working tree's file is read only where the folder is not a git checkout."""
    predicted = [
        r["pred"] for r in _committed_predictions() if (r["question"], r["db_id"]) == (question, db)
    ]
    assert predicted and predicted[0] == sql


@pytest.mark.parametrize("question, db, sql", _examples())
def test_each_example_is_what_the_model_answers(question, db, sql):
    """The Python API itself, where the pipeline's final model here is the committed one (its
    DVC md5 is the one the committed dvc.lock records for `merge`'s output)."""
    model = REPO_ROOT / FINAL
    if not (model / "config.json").is_file():
        pytest.skip("models/final is a pipeline output: run `dvc repro` to have it")
    here, committed = _final_md5s()
    if here != committed:
        pytest.skip(
            f"models/final is not the committed model (md5 {here}; the committed dvc.lock "
            f"records {committed}): a model trained on another CPU answers a little "
            "differently, so the README's examples were checked against the committed "
            "predictions instead"
        )
    from sqlrl.text_to_sql import TextToSQL

    assert TextToSQL(model, spider_dir=REPO_ROOT / "data/raw/spider")(question, db=db) == sql


def test_the_committed_model_is_recognised_by_dvcs_own_hash(tmp_path):
    """The guard above, on a one-stage DVC project: a directory output as its stage wrote it
    has the md5 the committed dvc.lock records; after one file of it changes, it has not; and
    the lock and files read are HEAD's, not the working tree's."""
    run_cli(["git", "init", "-q"], tmp_path)
    run_cli(["git", "config", "user.name", "tests"], tmp_path)
    run_cli(["git", "config", "user.email", "tests@sql-rl-pipeline.invalid"], tmp_path)
    run_cli(["dvc", "init", "-q"], tmp_path)
    make = "import pathlib; d = pathlib.Path('out'); d.mkdir(); (d / 'w').write_text('1')"
    run_cli(
        ["dvc", "stage", "add", "-q", "-n", "make", "-o", "out", f'python -c "{make}"'], tmp_path
    )
    run_cli(["dvc", "repro", "-q"], tmp_path)
    run_cli(["git", "add", "-A"], tmp_path)
    run_cli(["git", "commit", "-qm", "run"], tmp_path)

    committed = committed_out_md5("out", tmp_path)
    assert committed.endswith(".dir")
    assert workspace_out_md5("out", tmp_path) == committed
    (tmp_path / "out" / "w").write_text("2")  # as a run on another CPU would leave it
    assert workspace_out_md5("out", tmp_path) not in (committed, None)
    run_cli(["dvc", "commit", "-q", "-f"], tmp_path)  # the working tree's dvc.lock follows it
    assert committed_out_md5("out", tmp_path) == committed  # HEAD's dvc.lock is the one read
    (tmp_path / "out" / "w").unlink()
    (tmp_path / "out").rmdir()
    assert workspace_out_md5("out", tmp_path) is None


def test_outside_a_git_checkout_the_working_tree_is_read(tmp_path):
    (tmp_path / "f.txt").write_text("working tree\n")
    assert committed_text("f.txt", tmp_path) == "working tree\n"
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    inner = tmp_path / "inner"  # a folder inside some other repository: not its checkout
    inner.mkdir()
    (inner / "f.txt").write_text("inner\n")
    assert committed_text("f.txt", inner) == "inner\n"


def test_the_layout_names_every_part_of_the_package():
    """A newcomer finds every folder and module of sqlrl/ in the README's layout section: a
    module added without a line there fails here, naming it."""
    layout = re.search(r"## Layout\n\n```\n(.*?)```", README, re.S).group(1)
    named = set(re.findall(r"[\w/]+(?:\.py|/)", layout))
    package = REPO_ROOT / "sqlrl"
    parts = {p.name + "/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    parts |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    assert sorted(parts - named) == []
