"""prepare.extra_train: what users taught the server (Spider-format files under data/feedback/)
becomes training data, never a measured question."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest

from sqlrl.data.prepare import prepare
from sqlrl.data.spider import SpiderDataError
from sqlrl.params import ParamsError, compose_params, params_from_dict

TAUGHT = "How many singers are there in the taught file?"


def _prepare_params(extra_train):
    """The smoke profile's prepare section, no augmentation, no held-out split."""
    base = params_from_dict(compose_params("smoke")).prepare
    return dataclasses.replace(
        base,
        augment=dataclasses.replace(base.augment, copies=0),
        heldout_fraction=0.0,
        max_train_examples=0,
        max_dev_examples=0,
        extra_train=extra_train,
    )


def _run(root, extra_train):
    params = _prepare_params(extra_train)
    with contextlib.chdir(root):  # as DVC runs it, from the repo root
        metrics = prepare(params, 42, "data/raw/spider", "data/prepared", "data/feedback")
    rows = [json.loads(line) for line in (root / "data/prepared/sft.jsonl").open()]
    return metrics, rows


def _write_feedback(root, items):
    path = root / "data" / "feedback" / "verified.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items))
    return "verified.json"


def test_taught_pairs_land_in_the_sft_data_and_a_dev_query_does_not(mini_root):
    dev = json.loads((mini_root / "data/raw/spider/dev.json").read_text())
    dev_query = next(e for e in dev if e["db_id"] == "concert_singer")
    name = _write_feedback(
        mini_root,
        [
            {
                "db_id": "concert_singer",
                "question": TAUGHT,
                "query": "SELECT max(capacity) - min(capacity)  FROM stadium",
            },
            # the answer to a dev question, spaced differently: training on it would leak
            {"db_id": "concert_singer", "question": "leak?", "query": dev_query["query"] + " "},
            {"db_id": "wta_1", "question": "absent db", "query": "SELECT 1"},
        ],
    )
    before, rows_before = _run(mini_root, [])
    after, rows_after = _run(mini_root, [name])

    def questions(rows):
        return [r["prompt"][1]["content"] for r in rows]

    assert len(rows_after) == len(rows_before) + 1
    assert any(TAUGHT in q for q in questions(rows_after))
    assert not any(TAUGHT in q or "leak?" in q for q in questions(rows_before))
    assert not any("leak?" in q for q in questions(rows_after))
    assert (
        rows_after[-1]["completion"][0]["content"]
        == "SELECT max(capacity) - min(capacity) FROM stadium"  # whitespace folded
    )
    assert after["extra_train"] == {
        name: {
            "examples": 3,
            "kept": 1,
            "skipped_db_absent": 1,
            "skipped_evaluated_query": 1,
        }
    }
    assert "extra_train" not in before


def test_a_missing_or_malformed_file_is_named(mini_root):
    with pytest.raises(SpiderDataError, match="data/feedback/absent.json: no such file"):
        _run(mini_root, ["absent.json"])
    name = _write_feedback(mini_root, [{"db_id": "concert_singer", "question": "no query"}])
    with pytest.raises(SpiderDataError, match="verified.json: item 0 lacks query"):
        _run(mini_root, [name])


def test_a_path_outside_the_folder_dvc_tracks_is_refused_when_params_load():
    for name in ("../taught.json", "/tmp/taught.json"):
        with pytest.raises(ParamsError, match="is not a file name inside the prepare stage's"):
            params_from_dict(compose_params("smoke", [f"prepare.extra_train=[{name}]"]))
    ok = compose_params("smoke", ["prepare.extra_train=[taught.json]"])
    assert params_from_dict(ok).prepare.extra_train == ["taught.json"]
