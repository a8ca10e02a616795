"""Metrics files: small, stable JSON that git tracks and `dvc metrics diff` compares."""

from __future__ import annotations

import json
from pathlib import Path


def write_metrics(path: str | Path, metrics: dict) -> Path:
    """Write `metrics` as indented JSON with sorted keys; NaN/inf are refused (invalid JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(metrics, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)  # never leave a half-written metrics file behind
    return path


def read_metrics(path: str | Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
