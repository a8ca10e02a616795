"""Shared fixtures. Spider comes from the DVC remote (`dvc pull`); tests never download anything."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.repo_tools import (
    REPO_ROOT,
    SPIDER_DIR,
    run_cli,
    save_tiny_qwen,
    storage_url,
    tiny_arch,
    whole_spider_prepare_params,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture(autouse=True)
def process_environment_restored(request):
    """After each test of the real vLLM engine, os.environ as it was: TRL's colocated engine
    writes RANK, WORLD_SIZE, MASTER_ADDR/PORT and VLLM_ENABLE_V1_MULTIPROCESSING=0 into the
    process, and a later test's subprocess (a DVC stage, the rehearsal) would inherit them: a
    rendezvous on the port this process still holds, vLLM in-process where it should not be."""
    if request.node.get_closest_marker("vllm") is None:
        yield
        return
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def spider_dir():
    """The pulled Spider release (data/raw/spider). Missing data is an error, not a skip."""
    if not (SPIDER_DIR / "tables.json").is_file():
        pytest.fail(
            f"Spider is not pulled: {SPIDER_DIR} is missing. Run `dvc pull` first; if it "
            "said 'Everything is up to date', its remote is not reachable from this clone "
            "(`dvc remote list`: the default `storage` is a path relative to .dvc/)"
        )
    return SPIDER_DIR


def make_smoke_repo(repo, profile: str = "smoke", overrides: tuple[str, ...] = ()):
    """A git + DVC copy of this checkout's files (not its outputs) in `repo`, after a run of
    the whole DAG with `profile`.

    Spider and the evaluation sets are pulled from the shared DVC remote like a newcomer
    would; the profile is chosen with `dvc exp run -S profile=...`, which composes params.yaml
    from conf/ through Hydra.
    """
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (REPO_ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, repo / name)
    for generated in ("dvc.lock", "metrics", "data/predictions", "dvclive"):
        shutil.rmtree(repo / generated, ignore_errors=True) if (repo / generated).is_dir() else (
            repo / generated
        ).unlink(missing_ok=True)
    run_cli(["git", "init", "-q"], repo)
    # a repo-local identity: `dvc exp run` commits, and a fresh CI machine may have none
    run_cli(["git", "config", "user.name", "sql-rl-pipeline tests"], repo)
    run_cli(["git", "config", "user.email", "tests@sql-rl-pipeline.invalid"], repo)
    run_cli(["git", "add", "-A"], repo)
    run_cli(["git", "commit", "-qm", "copy"], repo)
    run_cli(["dvc", "remote", "modify", "--local", "storage", "url", storage_url()], repo)
    pointers = sorted(str(p.relative_to(repo)) for p in (repo / "data" / "raw").glob("*.dvc"))
    run_cli(["dvc", "pull", "-q", *pointers], repo)  # Spider and the evaluation sets
    sets = [arg for value in (f"profile={profile}", *overrides) for arg in ("-S", value)]
    run_cli(["dvc", "exp", "run", *sets], repo)  # the whole DAG
    return repo


@pytest.fixture(scope="session")
def smoke_repo(tmp_path_factory):
    """The smoke profile's whole pipeline, run once per session and shared by every test
    that only reads a run (pipeline/test_smoke, test_versioning). A test that changes a file in it
    puts the file back; one that needs another run makes its own with make_smoke_repo and
    says why."""
    return make_smoke_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="session")
def rehearsal_repo(tmp_path_factory):
    """The reference profile rehearsed on a CPU (qwen-rehearsal), the whole DAG, once, shared
    by pipeline/test_rehearsal (another profile: it cannot be the smoke run)."""
    return make_smoke_repo(tmp_path_factory.mktemp("rehearsal"), profile="qwen-rehearsal")


@pytest.fixture(scope="session")
def prepared_dir(spider_dir, tmp_path_factory):
    """data/prepared as the prepare stage writes it from the whole of the pulled Spider, in a
    temporary root, with the prompt format of the cpu profile written out here (compact
    schema, no sample rows, schema mentions marked, 10% of the training queries held out) and
    no augmentation (which only touches sft.jsonl)."""

    from sqlrl.data.prepare import prepare

    root = tmp_path_factory.mktemp("prepared_root")
    (root / "data" / "raw").mkdir(parents=True)
    (root / "data" / "raw" / "spider").symlink_to(spider_dir)
    prepare_params = whole_spider_prepare_params(mark_schema_mentions=True)
    with contextlib.chdir(root):  # as DVC runs it: rows hold data/raw/spider/... paths
        prepare(prepare_params, 42, "data/raw/spider", "data/prepared")
    return root / "data" / "prepared"


TINY_TEXTS = [  # what the tiny model's tokenizer is trained on
    "SELECT count(*) FROM singer",
    "SELECT name FROM stadium WHERE capacity > 100",
    "How many singers do we have?",
    "List the names of all concerts in 2014.",
    "table | col, col | table | col",
] * 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Qwen2 model (hidden 32, 2 layers) + ChatML tokenizer, saved and reloaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sqlrl.model.modeling import build_scratch_model, to_transformers_tokenizer, train_tokenizer

    arch = tiny_arch()
    tokenizer = to_transformers_tokenizer(train_tokenizer(TINY_TEXTS, arch.vocab_size))
    model = build_scratch_model(arch, tokenizer, seed=0)
    with torch.no_grad():  # larger weights than the init default: varied, well-separated logits
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), path


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    """A tiny random Qwen2 on Qwen2.5's real tokenizer and template (save_tiny_qwen), saved."""
    return save_tiny_qwen(tmp_path_factory.mktemp("tiny_qwen"))


@pytest.fixture
def private_db(spider_dir, tmp_path) -> Path:
    """A private copy of concert_singer, alone in its directory."""
    folder = tmp_path / "db"
    folder.mkdir()
    target = folder / "concert_singer.sqlite"
    shutil.copyfile(spider_dir / "database" / "concert_singer" / "concert_singer.sqlite", target)
    return target


@pytest.fixture(scope="session")
def postgres(spider_dir):
    """A real PostgreSQL server with PG_DATABASES loaded from Spider and the reader role
    (tests/postgres_helpers.py); skipped only where PostgreSQL's binaries are absent."""
    from tests.postgres_helpers import postgres_bin, postgres_server

    if postgres_bin() is None:
        pytest.skip(
            "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin): install Debian's "
            "postgresql (apt-get install postgresql; .ci/run does)"
        )
    with postgres_server() as server:
        yield server
