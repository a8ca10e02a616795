"""What every stage shares (stages/__init__.py, sqlrl/jsonio.py): one run at a time per stage,
and bad input files named by file and line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sqlrl.jsonio import DataFileError, read_jsonl
from sqlrl.train.grpo_prompts import ROW_KEYS
from stages import run_stage

REPO = Path(__file__).resolve().parents[1]
GOOD = '{"prompt": [], "gold_sql": "SELECT 1", "db_id": "d", "question": "q", "db_path": "p"}'


@pytest.mark.parametrize(
    "bad_line, says",
    [
        ('{"prompt": [], "gold_sql": ', "not valid JSON"),
        ('["a", "list"]', "a JSON list, not an object"),
        ('{"prompt": [], "db_id": "d", "question": "q", "db_path": "p"}', "no gold_sql"),
        ("1" * 5000, "not valid JSON"),  # json raises ValueError, not JSONDecodeError, for this
    ],
)
def test_a_malformed_line_is_named_by_file_and_line(tmp_path, bad_line, says):
    path = tmp_path / "grpo_prompts.jsonl"
    path.write_text(f"{GOOD}\n\n{bad_line}\n{GOOD}\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=rf"grpo_prompts.jsonl:3: {says}"):
        read_jsonl(path, ROW_KEYS)


def test_non_utf8_and_missing_files_are_named(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(DataFileError, match=r"dev.jsonl: not UTF-8"):
        read_jsonl(path)
    with pytest.raises(DataFileError, match=r"absent.jsonl: no such file"):
        read_jsonl(tmp_path / "absent.jsonl")


def test_a_stage_reports_a_bad_input_file_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "grpo_prompts.jsonl"
    path.write_text(GOOD + "\n{oops\n", encoding="utf-8")
    assert run_stage("grpo", lambda: read_jsonl(path, ROW_KEYS) and 0) == 1
    err = capsys.readouterr().err
    assert err.startswith("grpo: ") and f"{path}:2: not valid JSON" in err
    assert "Traceback" not in err


def test_a_second_run_of_a_running_stage_fails_at_once_naming_the_first(
    tmp_path, monkeypatch, capsys
):
    """Killing `dvc repro` can leave its stage running; a second run on the same outputs is
    refused while the first lives, and runs once it has gone."""
    monkeypatch.chdir(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from stages import stage_lock; "
            "h = stage_lock('grpo'); print('held', flush=True); time.sleep(60)",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        ran = []
        assert run_stage("grpo", lambda: ran.append(1) or 0) == 1
        assert not ran
        assert (
            f"another process (pid {holder.pid}) is running this stage" in capsys.readouterr().err
        )
        assert run_stage("sft", lambda: ran.append("sft") or 0) == 0  # other stages are free
    finally:
        holder.kill()
        holder.wait()
    assert run_stage("grpo", lambda: ran.append("grpo") or 0) == 0
    assert ran == ["sft", "grpo"]


def test_the_evaluate_summary_line_reads_sets_not_the_decoding_settings():
    """vLLM's decoding settings carry an `n` (its SamplingParams field): the summary line
    once took them for an evaluation set and the stage failed after scoring (KeyError 'ex')."""
    from stages.evaluate import _summary

    split = {"ex": 0.5, "ex_nontrivial": 0.5, "em": 0.25, "n": 4, "skipped": 0, "ex_all": 0.5}
    metrics = {
        "dev": {**split, "examples_per_second": 9.0},
        "spider_dk": split,
        "decoding": {"backend": "VLLMGenerator", "n": 1, "temperature": 0.0},
    }
    line = _summary("final", metrics)
    assert "spider_dk EX 50.0% on 4" in line and "decoding" not in line


def test_the_stage_lines_show_numbers_as_a_person_reads_them():
    """No float printed raw (`1.0296833038330078`, `11.350000000000001`) in the lines sft and
    evaluate end with: the loss to 4 digits, accuracies as percentages to one decimal."""
    import re

    from stages.evaluate import _summary as evaluate_summary
    from stages.sft import _summary as sft_summary

    raw = re.compile(r"\d\.\d{7,}")
    sft = {
        "rows_trained": 8,
        "examples": 8,
        "steps": 2,
        "final_loss": 1.0296833038330078,
        "wall_seconds": 12.3,
        "tokens_per_second": 11.4,
        "bf16": False,
        "bf16_reason": "auto: no bf16 kernels",
    }
    line = sft_summary(sft, "models/sft")
    assert "final loss 1.03, 12.3 s, 11.4 tokens/s" in line and not raw.search(line), line
    assert "final loss n/a" in sft_summary({**sft, "final_loss": None}, "models/sft")
    split = {"ex": 129 / 972, "ex_nontrivial": 0.1, "em": 0.05, "n": 4, "skipped": 0}
    metrics = {"dev": {**split, "ex_all": 0.30000000000000004, "examples_per_second": 9.0}}
    line = evaluate_summary("final", metrics)
    assert "dev EX 13.3%" in line and not raw.search(line), line
