"""JSON files: JSON Lines, the pipeline's data between stages (read with errors that name the
file and line), and the small JSON of metrics/ that git tracks and `dvc metrics diff` compares.
Both are written atomically: a killed stage never leaves half a file."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sqlrl.errors import PipelineError


class DataFileError(PipelineError, ValueError):
    """A data file the pipeline cannot use; the message names the file and line."""


class MissingDataFileError(DataFileError, FileNotFoundError):
    """A data file that is not there (its stage has not run)."""


def read_jsonl(
    path: str | Path, required: Iterable[str] = (), missing_ok: bool = False
) -> list[dict]:
    """The rows of a JSONL file. Every line must be a JSON object holding the `required` keys;
    otherwise a DataFileError names the file, the line and what is wrong (a stage that read it
    would fail later with a bare KeyError)."""
    path = Path(path)
    if missing_ok and not path.is_file():
        return []
    required = tuple(required)
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    rows.append(_row(line, required, f"{path}:{number}"))
    except UnicodeDecodeError as exc:
        raise DataFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except FileNotFoundError as exc:
        raise MissingDataFileError(
            f"{path}: no such file (run the stage that writes it: dvc repro)"
        ) from exc
    return rows


def _row(line: str, required: tuple[str, ...], where: str) -> dict:
    try:
        row = json.loads(line)
    except ValueError as exc:  # JSONDecodeError, and ints too long to convert
        raise DataFileError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(row, dict):
        raise DataFileError(f"{where}: a JSON {type(row).__name__}, not an object")
    missing = [key for key in required if key not in row]
    if missing:
        raise DataFileError(f"{where}: no {', '.join(missing)} (a row needs {', '.join(required)})")
    return row


def write_jsonl(path: str | Path, rows: list[dict]) -> Path:
    """One JSON object a line (an empty file for no rows), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def write_json(path: str | Path, data: dict) -> Path:
    """`data` as indented JSON with sorted keys, written atomically; NaN/inf are refused
    (invalid JSON, and `dvc metrics diff` could not compare them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
