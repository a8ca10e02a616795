"""What a params change reruns, on a copy of the smoke run: an evaluation set added by params
reruns no training; a feedback file added by params lands in the SFT data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.repo_tools import run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def smoke_copy(smoke_repo, tmp_path):
    """A copy of the shared smoke run (outputs, DVC cache and all) that a test may change."""
    copy = tmp_path / "repo"
    shutil.copytree(smoke_repo, copy, symlinks=True)
    return copy


def _stale_stages(repo) -> set[str]:
    """The stages `dvc status` says would rerun."""
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
        check=True,
    )
    return set(json.loads(done.stdout or "{}"))


def _edit_params(repo, change) -> None:
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    change(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def test_an_evaluation_set_added_by_params_reruns_no_training(smoke_copy):
    assert _stale_stages(smoke_copy) == set()

    def add_set(params):
        params["eval"]["sets"]["spider_syn_adv_bert"] = {
            "format": "spider",
            "questions": "spider-syn/WorstCaseDevSet/Adv(BERT).json",
            "tables": "spider/tables.json",
            "databases": ["spider/database"],
            "question_key": "",
        }

    _edit_params(smoke_copy, add_set)
    assert _stale_stages(smoke_copy) == {
        "prepare_eval",
        "evaluate@base",
        "evaluate@sft",
        "evaluate@final",
        "evaluate@final_constrained",
    }


def test_a_feedback_file_added_by_params_lands_in_the_sft_data(smoke_copy):
    taught = {
        "db_id": "concert_singer",
        "question": "Which stadium has the largest capacity, as a user taught it?",
        "query": "SELECT name FROM stadium ORDER BY capacity DESC LIMIT 1",
    }
    (smoke_copy / "data" / "feedback" / "verified.json").write_text(json.dumps([taught]))
    _edit_params(smoke_copy, lambda p: p["prepare"].update(extra_train=["verified.json"]))
    stale = _stale_stages(smoke_copy)
    assert "prepare" in stale and "prepare_eval" not in stale  # the prompts did not change
    run_cli(["dvc", "repro", "prepare"], smoke_copy)
    rows = [
        json.loads(line)
        for line in (smoke_copy / "data" / "prepared" / "sft.jsonl").read_text().splitlines()
    ]
    assert any(taught["question"] in row["prompt"][1]["content"] for row in rows)
    metrics = json.loads((smoke_copy / "metrics" / "prepare.json").read_text())
    assert metrics["extra_train"]["verified.json"]["kept"] == 1
    # what the new rows feed reruns; the evaluation sets' rows do not
    assert {"base", "sft"} <= _stale_stages(smoke_copy)
    assert "prepare_eval" not in _stale_stages(smoke_copy)
