"""Publishing: the dry run writes the model and its card; a push without a token says why."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from stages.publish import main
from tests.repo_tools import REPO_ROOT, write_fixed_params

BASE_REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def repo_with_final(tmp_path):
    """A repo root (the cwd of stages) with params (a hub base model), the Spider pointer,
    eval metrics and a (tiny) models/final."""
    write_fixed_params(
        tmp_path / "params.yaml",
        "base.source=hub",
        "base.model_id=acme/base-coder",
        f"base.revision={BASE_REVISION}",
        "prepare.schema_format=ddl",
        "sft.learning_rate=0.0002",
    )
    (tmp_path / "data" / "raw").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "data/raw/spider.dvc", tmp_path / "data/raw/spider.dvc")
    (tmp_path / "metrics").mkdir()
    for name, ex in (("base", 0.0), ("sft", 0.1), ("final", 0.125)):
        report = {"dev": {"ex": ex, "em": ex / 2, "by_hardness": {"easy": {"ex": ex * 2}}}}
        if name == "base":  # metrics from before the {"dev": ...} layout still read
            report = report["dev"]
        (tmp_path / "metrics" / f"eval_{name}.json").write_text(json.dumps(report))
    final = tmp_path / "models" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    (final / "model.safetensors").write_bytes(b"weights")
    return tmp_path


def test_dry_run_writes_folder_and_model_card(repo_with_final, monkeypatch, capsys):
    monkeypatch.chdir(repo_with_final)
    assert main(["--repo-id", "acme/sql-coder", "--dry-run", "--out", "out"]) == 0
    out = repo_with_final / "out"
    assert (out / "model.safetensors").read_bytes() == b"weights"
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlicense: cc-by-sa-4.0")
    assert "# acme/sql-coder" in card and "Spider 1.0" in card
    # what it was trained from and how, as params.yaml says
    assert "\nbase_model: acme/base-coder\n" in card
    assert f"- Base model: acme/base-coder @ `{BASE_REVISION}`" in card
    assert "- Profile: `smoke`" in card and "- Schema in the prompt: `ddl`" in card
    assert "  learning_rate: 0.0002\n" in card
    md5 = yaml.safe_load((REPO_ROOT / "data/raw/spider.dvc").read_text())["outs"][0]["md5"]
    assert f"DVC md5 `{md5}`" in card
    assert "| GRPO (final) | 12.5 | 6.2 | 25.0 |" in card
    assert "| base | 0.0 | 0.0 | 0.0 |" in card  # its metrics have the old layout
    assert "dry run" in capsys.readouterr().out


def test_push_without_token_is_a_clear_error(repo_with_final, monkeypatch, capsys):
    monkeypatch.chdir(repo_with_final)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    assert main(["--repo-id", "acme/sql-coder", "--out", "out"]) == 1
    assert "set HF_TOKEN" in capsys.readouterr().err


def test_missing_model_and_bad_repo_id(repo_with_final, monkeypatch, capsys):
    monkeypatch.chdir(repo_with_final)
    shutil.rmtree(repo_with_final / "models" / "final")
    assert main(["--repo-id", "acme/x", "--dry-run"]) == 1
    assert "dvc repro merge" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--repo-id", "not a repo id", "--dry-run"])
