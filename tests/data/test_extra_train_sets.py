"""prepare.extra_train_sets: BIRD's train split (or any set in eval.sets' shape) as SFT and
GRPO training rows, with each question's evidence in its prompt."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from sqlrl.params import ParamsError
from tests.repo_tools import REPO_ROOT, fixed_params, tables_entry, write_fixed_params

# BIRD's train release in miniature, in its exact layout and keys: train.json,
# train_tables.json, train_databases/<db>/<db>.sqlite (+ database_description/)
TRAIN = [
    {
        "db_id": "shop",
        "question": "How many items cost more than 10?",
        "evidence": "cost more than 10 refers to price > 10",
        "SQL": "SELECT COUNT(*) FROM items WHERE price > 10",
        "difficulty": "simple",
    },
    {
        "db_id": "shop",
        "question": "List the item names.",
        "evidence": "",
        "SQL": "SELECT name FROM items",
    },
    {
        "db_id": "warehouse",  # its database is not in the release copy: skipped, counted
        "question": "How many crates?",
        "evidence": "crates refers to kind = 'crate'",
        "SQL": "SELECT COUNT(*) FROM stock WHERE kind = 'crate'",
    },
]
SPEC = (
    "+prepare.extra_train_sets.bird_train={format: bird, questions: bird-train/train.json, "
    "tables: bird-train/train_tables.json, databases: [bird-train/train_databases]}"
)


@pytest.fixture
def bird_train(mini_root):
    """mini_root with data/raw/bird-train/ laid out as BIRD's train release is."""
    root = mini_root / "data" / "raw" / "bird-train"
    db_dir = root / "train_databases" / "shop"
    (db_dir / "database_description").mkdir(parents=True)
    (db_dir / "database_description" / "items.csv").write_bytes(
        b"original_column_name,column_name,column_description,data_format,value_description\r\n"
        b"price,,price in dollars,real,\r\n"
    )
    with contextlib.closing(sqlite3.connect(db_dir / "shop.sqlite")) as con:
        con.execute("CREATE TABLE items (name TEXT, price REAL)")
        con.executemany("INSERT INTO items VALUES (?, ?)", [("pen", 2.0), ("lamp", 30.0)])
        con.commit()
    (root / "train.json").write_text(json.dumps(TRAIN, indent=2))
    (root / "train_tables.json").write_text(
        json.dumps(
            [
                tables_entry("shop", "items", ["name", "price"]),
                tables_entry("warehouse", "stock", ["kind"]),
            ]
        )
    )
    return mini_root


def _prepare_cli(root, *overrides):
    """The prepare stage as dvc.yaml runs it, from the repo root `root`."""
    params = write_fixed_params(root / "params.yaml", "prepare.augment.copies=0", *overrides)
    return subprocess.run(
        [sys.executable, "-m", "stages.prepare", "--params", str(params)]
        + ["--spider", "data/raw/spider", "--raw", "data/raw"]
        + ["--out", "data/prepared", "--metrics", "metrics/prepare.json"],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
    )


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_bird_train_set_becomes_sft_and_grpo_rows_with_its_evidence(bird_train):
    done = _prepare_cli(bird_train)
    assert done.returncode == 0, done.stderr
    spider_sft = _lines(bird_train / "data/prepared/sft.jsonl")
    spider_grpo = _lines(bird_train / "data/prepared/grpo.jsonl")

    done = _prepare_cli(bird_train, SPEC)
    assert done.returncode == 0, done.stderr
    sft = _lines(bird_train / "data/prepared/sft.jsonl")
    grpo = _lines(bird_train / "data/prepared/grpo.jsonl")
    assert sft[: len(spider_sft)] == spider_sft and grpo[: len(spider_grpo)] == spider_grpo
    added, added_grpo = sft[len(spider_sft) :], grpo[len(spider_grpo) :]
    assert [row["completion"][0]["content"] for row in added] == [q["SQL"] for q in TRAIN[:2]]
    user = added[0]["prompt"][1]["content"]
    assert "items | name, price\n" in user
    assert user.endswith(
        "Evidence: cost more than 10 refers to price > 10\n"
        "Question: How many items cost more than 10?"
    )
    assert "Evidence:" not in added[1]["prompt"][1]["content"]  # none given: no empty line
    assert added_grpo[0] == {
        "prompt": added[0]["prompt"],
        "gold_sql": TRAIN[0]["SQL"],
        "db_id": "shop",
        "question": TRAIN[0]["question"],
        "db_path": "data/raw/bird-train/train_databases/shop/shop.sqlite",  # repo-relative
    }
    metrics = json.loads((bird_train / "metrics/prepare.json").read_text())
    assert metrics["extra_train_sets"] == {
        "bird_train": {
            "format": "bird",
            "examples": 3,
            "kept": 2,
            "skipped_db_absent": 1,
            "absent_databases": ["warehouse"],
        }
    }
    # the prompt settings apply as to every other row: BIRD's column notes when asked
    done = _prepare_cli(bird_train, SPEC, "prepare.column_descriptions=true")
    assert done.returncode == 0, done.stderr
    described = _lines(bird_train / "data/prepared/sft.jsonl")[len(spider_sft)]
    assert "items | name, price (price in dollars)\n" in described["prompt"][1]["content"]


def test_a_missing_or_malformed_train_set_file_is_one_line_naming_the_set_and_file(bird_train):
    train = bird_train / "data/raw/bird-train/train.json"
    train.write_text(json.dumps(TRAIN)[:-5])
    done = _prepare_cli(bird_train, SPEC)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "prepare.extra_train_sets.bird_train: " in lines[0]
    assert "bird-train/train.json: not valid JSON" in lines[0]

    train.unlink()
    done = _prepare_cli(bird_train, SPEC)
    assert done.returncode != 0
    assert (
        "prepare.extra_train_sets.bird_train: data/raw/bird-train/train.json: no such file"
        in done.stderr
    )
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_training_set_that_is_also_evaluated_is_refused_when_params_load():
    leak = (
        "+prepare.extra_train_sets.bird={format: bird, questions: bird-dev/dev.json, "
        "tables: bird-dev/dev_tables.json, databases: [bird-dev/dev_databases]}"
    )
    with pytest.raises(ParamsError, match="trains on bird-dev/dev.json, which eval.sets.bird_dev"):
        fixed_params(leak)


def test_no_training_set_without_the_folder_that_holds_it(bird_train):
    from sqlrl.data.prepare import prepare

    params = fixed_params("prepare.augment.copies=0", SPEC).prepare
    with contextlib.chdir(bird_train), pytest.raises(ValueError, match=r"no folder \(--raw\)"):
        prepare(params, 42, "data/raw/spider", "data/prepared")
