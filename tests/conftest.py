"""Shared fixtures. Spider comes from the DVC remote (`dvc pull`); tests never download anything."""
from __future__ import annotations

import os

import pytest

from sqlrl.paths import SPIDER_DIR

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture(scope="session")
def spider_dir():
    """The pulled Spider release (data/raw/spider). Missing data is an error, not a skip."""
    if not (SPIDER_DIR / "tables.json").is_file():
        pytest.fail(f"Spider is not pulled: {SPIDER_DIR} is missing. Run `dvc pull` first.")
    return SPIDER_DIR
