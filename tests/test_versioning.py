"""Data and model versioning through the S3 remote, against a local S3 server (moto)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import boto3
import pytest

from tests.repo_tools import run_cli

pytestmark = pytest.mark.slow
BUCKET = "sql-rl-pipeline"  # the bucket .dvc/config names for the `s3` remote
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
VERSIONED = ("data/raw/spider", "data/prepared", "models")


@pytest.fixture(scope="module")
def s3_endpoint():
    """An S3-compatible server on 127.0.0.1 (ephemeral port) with the project's bucket."""
    # imported here, not at collection: moto's flask request proxies in sys.modules break vLLM
    # 0.32's CPU engine start in the same pytest process (its Triton-kernel rebinding scan
    # calls hasattr on every module global: "Working outside of application context")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    _s3_client(url).create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


def _s3_client(endpoint: str):
    """boto3 for the test server, with the same credentials DVC gets from CREDENTIALS."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def _digests(repo: Path) -> dict[str, str]:
    """md5 of every file of the versioned data and models, by path relative to the repo."""
    out = {}
    for top in VERSIONED:
        for path in sorted((repo / top).rglob("*")):
            if path.is_file() and path.name != ".gitignore":  # git-tracked, not versioned data
                out[path.relative_to(repo).as_posix()] = hashlib.md5(path.read_bytes()).hexdigest()
    return out


def _teammate_checkout(repo: Path, dest: Path) -> Path:
    """What a teammate has after `git clone`: the tracked tree, no DVC cache, no outputs."""
    ignore = shutil.ignore_patterns("cache", "tmp", "models", "prepared", "spider")
    shutil.copytree(repo, dest, ignore=ignore)
    assert not (dest / "models").exists() and not (dest / "data" / "prepared").exists()
    return dest


def _use_endpoint(repo: Path, endpoint: str) -> None:
    run_cli(["dvc", "remote", "modify", "--local", "s3", "endpointurl", endpoint], repo)


def test_push_and_pull_through_s3_restore_identical_files(smoke_repo, s3_endpoint, tmp_path):
    _use_endpoint(smoke_repo, s3_endpoint)
    run_cli(["dvc", "push", "-r", "s3", "--run-cache"], smoke_repo, env=CREDENTIALS)
    listed = _s3_client(s3_endpoint).list_objects_v2(Bucket=BUCKET, Prefix="dvc/")
    assert listed["KeyCount"] > 0

    teammate = _teammate_checkout(smoke_repo, tmp_path / "teammate")
    _use_endpoint(teammate, s3_endpoint)
    run_cli(["dvc", "pull", "-r", "s3"], teammate, env=CREDENTIALS)
    expected = _digests(smoke_repo)
    assert any(p.startswith("models/sft/") for p in expected)
    assert _digests(teammate) == expected


def test_repro_pull_skips_stages_computed_elsewhere(smoke_repo, s3_endpoint, tmp_path):
    _use_endpoint(smoke_repo, s3_endpoint)
    run_cli(["dvc", "push", "-r", "s3", "--run-cache"], smoke_repo, env=CREDENTIALS)
    teammate = _teammate_checkout(smoke_repo, tmp_path / "teammate")
    _use_endpoint(teammate, s3_endpoint)
    run_cli(["dvc", "remote", "default", "--local", "s3"], teammate)
    out = run_cli(["dvc", "repro", "--pull"], teammate, env=CREDENTIALS)
    assert "Running stage" not in out, out
    assert _digests(teammate) == _digests(smoke_repo)
