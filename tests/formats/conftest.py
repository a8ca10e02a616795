"""Fixtures the format tests share."""

from __future__ import annotations

import json

import pytest

from sqlrl.jsonio import read_jsonl


@pytest.fixture(scope="module")
def singer_rows(prepared_dir, tmp_path_factory):
    """Four concert_singer dev rows as prepare writes them (prepare's system prompt)."""
    rows = [r for r in read_jsonl(prepared_dir / "dev.jsonl") if r["db_id"] == "concert_singer"]
    path = tmp_path_factory.mktemp("agent_eval") / "dev.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    return path, rows[:4]
