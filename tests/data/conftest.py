"""Fixtures the data tests share: a repo root holding a few databases of the real Spider."""

from __future__ import annotations

import json
import shutil

import pytest

DBS = [
    "concert_singer",
    "department_management",
    "farm",
    "wta_1",
]  # wta_1 is absent from this copy of Spider


@pytest.fixture
def mini_root(spider_dir, tmp_path):
    """A repo root whose data/raw/spider holds three databases' worth of the real release."""
    out = tmp_path / "data" / "raw" / "spider"
    (out / "database").mkdir(parents=True)
    tables = [t for t in json.loads((spider_dir / "tables.json").read_text()) if t["db_id"] in DBS]
    (out / "tables.json").write_text(json.dumps(tables))
    for name in ("train_spider.json", "dev.json"):
        items = [e for e in json.loads((spider_dir / name).read_text()) if e["db_id"] in DBS]
        (out / name).write_text(json.dumps(items))
    for db in DBS:
        if (spider_dir / "database" / db).is_dir():
            shutil.copytree(spider_dir / "database" / db, out / "database" / db)
    return tmp_path
