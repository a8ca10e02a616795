"""BIRD's column descriptions (`prepare.column_descriptions`): what a column holds, in words.

BIRD ships, beside each database, `database_description/<table>.csv` with the columns
original_column_name, column_name, column_description, data_format and value_description.
BIRD's names are often abbreviations (`A11`, `cnt`) whose meaning only these files give,
so the prompt builder can attach a short description to each column of the schema text. The
files are as BIRD's annotators saved them: quoted multi-line fields, CRLF in some, and some
not UTF-8 (Windows-1252), so each is decoded as UTF-8 (with or without a BOM), else as
Windows-1252, else as Latin-1, which reads any byte. A database without the folder (every
Spider database) simply has no descriptions.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from sqlrl.data.spider import SpiderDataError

DESCRIPTION_FOLDER = "database_description"
DESCRIPTION_CHARS = 120  # a description longer than this is cut: prompts stay short
_ENCODINGS = ("utf-8-sig", "cp1252")  # then latin-1, which decodes any byte
_KEY = "original_column_name"
# BIRD's value descriptions often open with this label, which tells a model nothing
_LABEL = "commonsense evidence:"


def read_descriptions(db_dir: str | Path) -> dict[str, dict[str, str]]:
    """{table: {column: description}} from `db_dir`/database_description/, table and column
    names lower-cased (BIRD's file names and names differ in case from the schema's at
    times); empty when the folder is absent. A file without an original_column_name column,
    or that is not CSV, is an error naming the file (and the line)."""
    folder = Path(db_dir) / DESCRIPTION_FOLDER
    if not folder.is_dir():
        return {}
    return {
        path.stem.strip().lower(): _read_table(path)
        for path in sorted(folder.iterdir())
        if path.suffix.lower() == ".csv" and path.is_file()
    }


def _read_table(path: Path) -> dict[str, str]:
    reader = csv.reader(io.StringIO(_decode(path.read_bytes()), newline=""))
    try:
        header = [name.strip().lower() for name in next(reader, [])]
        if _KEY not in header:
            raise SpiderDataError(f"{path}:1: no {_KEY} column in the header {header}")
        notes = {}
        for row in reader:
            fields = dict(zip(header, row, strict=False))
            column = " ".join(fields.get(_KEY, "").split()).lower()
            if column:
                notes[column] = describe(column, fields)
    except csv.Error as exc:
        raise SpiderDataError(f"{path}:{reader.line_num}: not valid CSV: {exc}") from None
    return {column: note for column, note in notes.items() if note}


def _decode(data: bytes) -> str:
    for encoding in _ENCODINGS:
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    return data.decode("latin-1")


# Windows-1252 punctuation that was saved as UTF-8 control characters (U+0080-U+009F: BIRD's
# toxicology bullets are U+0095): the character it was meant to be; undefined ones and the
# replacement character U+FFFD (a byte lost before the release) are dropped
_MOJIBAKE = {
    code: bytes([code]).decode("cp1252", errors="ignore") or None for code in range(0x80, 0xA0)
} | {0xFFFD: None}


def _clean(text: str | None) -> str:
    return " ".join((text or "").translate(_MOJIBAKE).split())


def describe(column: str, fields: dict[str, str]) -> str:
    """One line about a column: its description (or expanded name) and what its values
    mean, without what the name already says, cut to DESCRIPTION_CHARS."""
    text = _clean(fields.get("column_description") or fields.get("column_name"))
    if text.lower() in (column.lower(), column.replace("_", " ").lower()):
        text = ""  # "event name" for event_name: the name says it
    values = _clean(fields.get("value_description"))
    if values.lower().startswith(_LABEL):
        values = values[len(_LABEL) :].strip()
    text = "; ".join(part for part in (text, values) if part)
    if len(text) > DESCRIPTION_CHARS:
        text = text[: DESCRIPTION_CHARS - 3].rstrip() + "..."
    return text
