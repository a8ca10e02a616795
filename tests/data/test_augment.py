"""Schema-grounding augmentation: consistent renames in schema, SQL and question."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys

import pytest

from sqlrl.data.augment import (
    Augmenter,
    UnsafeRename,
    mark_question,
    name_pools,
    rename_question,
    rename_schema,
    rename_sql,
    schema_mentions,
    shuffle_schema,
)
from sqlrl.data.prepare import prepare
from sqlrl.data.spider import Column, Schema, Table, load_schemas
from tests.repo_tools import REPO_ROOT, fixed_params

SCHEMA = Schema(
    "d",
    (
        Table(
            "head",
            (
                Column("head_ID", "number", True),
                Column("name", "text", False),
                Column("born_state", "text", False),
                Column("age", "number", False),
            ),
        ),
        Table(
            "management",
            (Column("head_ID", "number", False), Column("department_ID", "number", False)),
        ),
    ),
    (),
)


def test_rename_sql_keeps_style_and_renames_every_identifier():
    sql = (
        "SELECT T1.name ,  count(*) FROM head AS T1 JOIN management AS T2 ON T1.head_ID  =  "
        "T2.head_ID WHERE T1.born_state = 'head' GROUP BY T1.name"
    )
    mapping = {"head": "boss", "head_id": "boss_key", "name": "label"}
    out = rename_sql(sql, mapping)
    assert out == (
        "SELECT T1.label ,  count(*) FROM boss AS T1 JOIN management AS T2 ON "
        "T1.boss_key  =  T2.boss_key WHERE T1.born_state = 'head' GROUP BY T1.label"
    )


def test_rename_sql_refuses_what_it_cannot_rename_safely():
    with pytest.raises(UnsafeRename):
        rename_sql("SELECT count(*) AS name FROM head ORDER BY name", {"name": "label"})
    with pytest.raises(UnsafeRename):
        rename_sql('SELECT age FROM head WHERE name = "age"', {"age": "years"})
    with pytest.raises(UnsafeRename):
        rename_sql("SELEC age FROM (", {"age": "years"})


def test_question_mentions_follow_the_renames():
    q, n = rename_question(
        "List the name and born state of heads older than 56.",
        {"head": "boss", "born_state": "home_region", "name": "label"},
    )
    assert q == "List the label and home region of boss older than 56."
    assert n == 3


def test_schema_rename_and_shuffle_keep_the_content():
    renamed = rename_schema(SCHEMA, {"head_id": "boss_key"})
    assert [c.name for c in renamed.tables[1].columns] == ["boss_key", "department_ID"]
    shuffled = shuffle_schema(SCHEMA, random.Random(1))
    assert sorted(t.name for t in shuffled.tables) == ["head", "management"]
    assert {(t.name, c.name) for t in shuffled.tables for c in t.columns} == {
        (t.name, c.name) for t in SCHEMA.tables for c in t.columns
    }


def test_augmenter_is_deterministic_and_consistent(spider_dir):
    schemas = load_schemas(spider_dir / "tables.json")
    schema = schemas["department_management"]
    pools = name_pools(schemas.values())
    sql = "SELECT name , born_state , age FROM head ORDER BY age"
    question = "List the name, born state and age of the heads of departments ordered by age."
    a = Augmenter(True, 1.0, pools, seed=3).augment(schema, question, sql, "0:0")
    b = Augmenter(True, 1.0, pools, seed=3).augment(schema, question, sql, "0:0")
    assert a == b
    new_schema, new_q, new_sql = a
    names = {t.name.lower() for t in new_schema.tables} | {
        c.name.lower() for t in new_schema.tables for c in t.columns
    }
    for word in new_sql.replace(",", " ").split():
        if word.upper() not in ("SELECT", "FROM", "ORDER", "BY"):
            assert word.lower() in names, (word, new_sql)
    assert "head" not in new_sql.split()


def test_schema_mentions_are_marked():
    assert schema_mentions("Names of heads born in state X", SCHEMA) == ["head", "head.name"]
    marked = mark_question("How old is the born state?", SCHEMA)
    assert marked.endswith("Schema mentions: head.born_state.")


def _one_database_root(tmp_path, spider_dir, db="department_management"):
    """A repo root whose raw Spider holds one database (prepare runs in seconds)."""
    out = tmp_path / "data" / "raw" / "spider"
    (out / "database" / db).mkdir(parents=True)
    (out / "tables.json").write_text(
        json.dumps(
            [t for t in json.loads((spider_dir / "tables.json").read_text()) if t["db_id"] == db]
        )
    )
    for name in ("train_spider.json", "dev.json"):
        items = [e for e in json.loads((spider_dir / name).read_text()) if e["db_id"] == db]
        (out / name).write_text(json.dumps(items))
    (out / "database" / db / f"{db}.sqlite").write_bytes(
        (spider_dir / "database" / db / f"{db}.sqlite").read_bytes()
    )
    return tmp_path


def _prepare_with_copies(root, copies, rename_prob=0.5):
    base = fixed_params().prepare
    params = dataclasses.replace(
        base,
        schema_format="compact",
        sample_rows=0,
        max_train_examples=0,
        heldout_fraction=0.0,
        mark_schema_mentions=False,
        augment=dataclasses.replace(
            base.augment, copies=copies, shuffle_schema=True, rename_prob=rename_prob
        ),
    )
    metrics = prepare(params, 42, root / "data/raw/spider", root / "data/prepared")
    read = lambda n: [json.loads(l) for l in open(root / "data/prepared" / n)]  # noqa: E731
    return metrics, read("sft.jsonl"), read("grpo.jsonl")


def test_prepare_adds_augmented_copies_to_sft_only(tmp_path, spider_dir):
    metrics, sft, grpo = _prepare_with_copies(_one_database_root(tmp_path, spider_dir), 2)
    assert len(sft) == 3 * len(grpo)
    assert [r["prompt"] for r in sft[: len(grpo)]] == [r["prompt"] for r in grpo]
    assert metrics["augment"]["copies"] == 2 and metrics["augment"]["renamed"] > 0


def test_fractional_copies_augment_a_seeded_share_of_the_examples(tmp_path, spider_dir):
    root = _one_database_root(tmp_path, spider_dir)
    metrics, sft, grpo = _prepare_with_copies(root, 1.5)
    n = len(grpo)
    assert len(sft) == 2 * n + round(0.5 * n) and metrics["augment"]["examples"] == len(sft) - n
    assert _prepare_with_copies(root, 1.5)[1] == sft  # same seed, same rows
    # shuffle only: each copy keeps its example's question, so the half-round's examples show;
    # they are distinct, and a sample rather than the first half again
    _, sft, grpo = _prepare_with_copies(root, 0.5, rename_prob=0.0)
    copied = [
        next(i for i, g in enumerate(grpo) if g["question"] in r["prompt"][-1]["content"])
        for r in sft[n:]
    ]
    assert len(copied) == len(set(copied)) == round(0.5 * n)
    assert copied != list(range(len(copied)))


def test_augmented_rows_do_not_depend_on_the_hash_seed(tmp_path, spider_dir):
    """A rerun of prepare (a new process, a new PYTHONHASHSEED) writes the same sft.jsonl."""
    root = _one_database_root(tmp_path, spider_dir)
    code = (
        "import sys, dataclasses; from pathlib import Path; "
        "from tests.repo_tools import fixed_params; "
        "from sqlrl.data.prepare import prepare; b = fixed_params().prepare; "
        "prepare(dataclasses.replace(b, schema_format='compact', sample_rows=0, "
        "max_train_examples=0, heldout_fraction=0.0, mark_schema_mentions=True, "
        "augment=dataclasses.replace(b.augment, copies=2, shuffle_schema=True, "
        "rename_prob=0.5)), 42, Path(sys.argv[1], 'data/raw/spider'), "
        "Path(sys.argv[1], 'data/prepared'))"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run(
            [sys.executable, "-c", code, str(root)],
            check=True,
            env=env,
            cwd=REPO_ROOT,
        )
        outputs.append((root / "data/prepared/sft.jsonl").read_bytes())
    assert outputs[0] == outputs[1]
