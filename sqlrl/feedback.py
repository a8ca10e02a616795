"""Judgements of the model's answers, kept so that they become training data.

People who use the server (the playground page, `POST /feedback`) mark an answer right, or
wrong and give the SQL that is right. `FeedbackStore` keeps each judgement in a SQLite file
(WAL journal, full sync, one transaction per record): several server processes may write to
one file, and a judgement the server acknowledged survives the server being killed, since
the acknowledgement is sent only after its transaction committed.

    python -m sqlrl.feedback export --db feedback.sqlite \\
        --spider data/raw/spider --out data/feedback/verified.json

writes the verified pairs (answers marked right, and corrections) as Spider's train format
(a JSON list of {"db_id", "question", "query"}; sqlrl.data.spider.load_examples reads it like
train_spider.json). Only pairs that teach something true are exported, and the command says
why each other judgement was skipped:

- each record keeps who wrote it (`writer`: the API key's id, or "local page" for the
  server's own playground; sqlrl.serve.trust), when, and which model answered; records with
  no writer (stored before writers were recorded) are left out unless --include-unattributed;
- of the judgements of one question on one database, the newest whose SQL runs stands: a
  newer record never silently erases an older verified one (a newer one that fails to run, or
  that marks the very same SQL wrong, is reported); the server also runs a correction before
  it stores it and refuses one that fails;
- the SQL must run on its database (read-only, sandboxed), and a schema given as DDL has no
  database to check it on.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import unicodedata
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

VERDICTS = ("right", "wrong")
SCHEMA_VERSION = 3  # 2: the writer column; 3: the dialect column
SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,            -- UTC, ISO 8601
    model TEXT NOT NULL,                 -- the served model's name
    db_id TEXT,                          -- a Spider database of the server ...
    ddl TEXT,                            -- ... or the schema the question was asked about
    question TEXT NOT NULL,
    predicted_sql TEXT NOT NULL,
    verdict TEXT NOT NULL CHECK (verdict IN ('right', 'wrong')),
    corrected_sql TEXT,
    writer TEXT,                         -- "key:<id>" or "local page"; NULL: before version 2
    dialect TEXT,                        -- a live database's (postgres, sqlite); NULL: Spider's
    CHECK ((db_id IS NULL) <> (ddl IS NULL)),
    CHECK (corrected_sql IS NULL OR verdict = 'wrong')
)
"""


class FeedbackError(ValueError):
    """The feedback database cannot be used; the message says which file and why."""


@dataclass(frozen=True)
class Judgement:
    """One person's verdict on one answer. `corrected_sql`: the right SQL, for a wrong one."""

    question: str
    predicted_sql: str
    verdict: str  # right | wrong
    model: str
    db_id: str | None = None
    ddl: str | None = None
    corrected_sql: str | None = None
    writer: str | None = None  # who wrote it: "key:<id>" or "local page" (sqlrl.serve.trust)
    dialect: str | None = None  # a live database's dialect (db_id names it); None: Spider's
    created_at: str = ""  # set by the store when it is written
    id: int | None = None  # set by the store


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class FeedbackStore:
    """Judgements in a SQLite file (see the module docstring for the guarantees).

    A connection per call: writes come one per human click, and a fresh connection needs no
    locking between the server's threads."""

    def __init__(self, path: str | os.PathLike, busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connection() as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(SCHEMA)
                upgrade(conn)
                conn.execute("COMMIT")
        except (OSError, sqlite3.Error) as exc:
            raise FeedbackError(f"feedback database {self.path}: {exc}") from None

    def _connection(self) -> _Connection:
        return _Connection(self.path, self.busy_timeout_s)

    def add(self, judgement: Judgement) -> Judgement:
        """Store one judgement in its own transaction; returns it with its id and time. When
        this returns, the record is on disk (synchronous=FULL). Every record names its
        writer."""
        if not judgement.writer:
            raise FeedbackError("a judgement must name its writer (an API key id or the page)")
        row = asdict(judgement)
        row.update(created_at=judgement.created_at or now_utc())
        row.pop("id")
        names = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            cursor = conn.execute(
                f"INSERT INTO feedback ({names}) VALUES ({marks})", list(row.values())
            )
            conn.execute("COMMIT")
        return Judgement(**{**row, "id": cursor.lastrowid})

    def all(self) -> list[Judgement]:
        """Every judgement, oldest first."""
        names = [f.name for f in fields(Judgement)]
        with self._connection() as conn:
            rows = conn.execute(f"SELECT {', '.join(names)} FROM feedback ORDER BY id").fetchall()
        return [Judgement(**dict(zip(names, row, strict=True))) for row in rows]


def upgrade(conn: sqlite3.Connection) -> None:
    """Bring a feedback file written by an older version to SCHEMA_VERSION, in place: version
    1 had no writer column (its records keep a NULL writer: unattributed), version 2 no
    dialect column (its records are all about Spider's databases: NULL)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(
            f"written by a newer sqlrl (schema version {version}, this one reads "
            f"{SCHEMA_VERSION}): update sqlrl"
        )
    columns = {row[1] for row in conn.execute("PRAGMA table_info(feedback)")}
    if "writer" not in columns:
        conn.execute("ALTER TABLE feedback ADD COLUMN writer TEXT")
    if "dialect" not in columns:
        conn.execute("ALTER TABLE feedback ADD COLUMN dialect TEXT")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


class _Connection:
    """A short-lived connection in autocommit mode (transactions are explicit), waiting up to
    `busy_timeout_s` for another writer, syncing every commit to disk."""

    def __init__(self, path: Path, busy_timeout_s: float):
        self.conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
        self.conn.execute("PRAGMA synchronous=FULL")

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, kind, exc, tb) -> None:
        if kind is not None and self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        self.conn.close()


# --------------------------------------------------------------------------- export


UNATTRIBUTED = "no recorded writer (stored before writers were recorded; --include-unattributed)"


@dataclass
class Skip:
    id: int
    reason: str  # the kind of reason (the report groups by it)
    detail: str = ""


def question_key(j: Judgement) -> tuple:
    """Judgements of the same question on the same database (or DDL) share a key."""
    return (j.db_id, j.ddl, unicodedata.normalize("NFC", j.question).strip())


def verified_sql(j: Judgement) -> str | None:
    """The SQL a judgement vouches for: the answer marked right, or the correction."""
    if j.verdict == "right":
        return j.predicted_sql
    return j.corrected_sql or None


def check_pair(j: Judgement, spider_dir: Path, schemas: dict, executor) -> Skip | None:
    """Why judgement `j` cannot be a training pair, or None when it can."""
    from sqlrl.data.spider import database_path

    sql = verified_sql(j)
    if sql is None:
        return Skip(j.id, "marked wrong without a correction")
    if j.db_id is None:
        return Skip(j.id, "schema given as DDL: no database to check the SQL on")
    if j.dialect is not None:
        return Skip(j.id, f"a live {j.dialect} database, not one of Spider's", j.db_id)
    if j.db_id not in schemas:
        return Skip(j.id, "db_id not in tables.json", j.db_id)
    path = database_path(spider_dir, j.db_id)
    if not path.is_file():
        return Skip(j.id, "database file absent", j.db_id)
    verdict = executor.execute(path, sql)
    if not verdict.ok:
        return Skip(j.id, "does not run on its database", f"{verdict.status}: {verdict.error}")
    return None


def pair(j: Judgement) -> dict:
    """A Spider train item (what sqlrl.data.spider.load_examples reads), with its source."""
    return {
        "db_id": j.db_id,
        "question": unicodedata.normalize("NFC", j.question).strip(),
        "query": verified_sql(j).strip(),
        "feedback_id": j.id,
    }


def sql_key(sql: str) -> str:
    """SQL compared as a person would (case and spacing aside)."""
    return " ".join(sql.split()).rstrip(";").lower()


def standing_pair(group: list[Judgement], check) -> tuple[Judgement | None, list[Skip]]:
    """The judgement of one question that stands, and why each other one is skipped.

    Newest first, the first judgement whose SQL runs (`check(j)` is None) and that no newer
    judgement marked wrong (without a correction) stands; older ones are superseded by it. A
    newer record that fails does not erase an older verified one: both stay in the store,
    the failure is reported, and the older pair is exported."""
    chosen, skipped = None, []
    marked_wrong: dict[str, int] = {}  # SQL that a newer judgement marked wrong -> its id
    for j in reversed(group):
        if chosen is not None:
            skipped.append(
                Skip(j.id, "superseded by a later judgement of the same question", f"#{chosen.id}")
            )
            continue
        skip = check(j)
        sql = verified_sql(j)
        if skip is None and sql_key(sql) in marked_wrong:
            skip = Skip(j.id, "marked wrong by a later judgement", f"#{marked_wrong[sql_key(sql)]}")
        if j.verdict == "wrong" and j.corrected_sql is None:  # a slip in a correction is not
            marked_wrong.setdefault(sql_key(j.predicted_sql), j.id)  # a verdict on the answer
        if skip is None:
            chosen = j
        else:
            skipped.append(skip)
    return chosen, skipped


def verified_pairs(
    judgements: list[Judgement],
    spider_dir: Path,
    timeout_s: float = 5.0,
    include_unattributed: bool = False,
) -> tuple[list[dict], list[Skip]]:
    """(Spider train items, skipped judgements) for `judgements`, oldest first."""
    from sqlrl.data.spider import load_schemas
    from sqlrl.sql.executor import ExecLimits, SQLExecutor

    schemas = load_schemas(spider_dir / "tables.json")
    skipped: list[Skip] = []
    by_question: dict[tuple, list[Judgement]] = defaultdict(list)
    for j in judgements:  # oldest first
        if j.writer is None and not include_unattributed:
            skipped.append(Skip(j.id, UNATTRIBUTED))
        else:
            by_question[question_key(j)].append(j)
    executor = SQLExecutor(ExecLimits(timeout_s=timeout_s))
    chosen = []
    try:
        for group in by_question.values():
            j, skips = standing_pair(group, lambda j: check_pair(j, spider_dir, schemas, executor))
            chosen += [j] if j is not None else []
            skipped += skips
    finally:
        executor.close()
    pairs = [pair(j) for j in sorted(chosen, key=lambda j: j.id)]
    return pairs, sorted(skipped, key=lambda s: s.id)


def write_json(path: Path, items: list[dict]) -> None:
    """The file written whole or not at all (a temporary file renamed over it), the same bytes
    for the same pairs, so DVC reruns only what a new judgement changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(items, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def skip_report(skipped: list[Skip]) -> list[str]:
    """One line per reason: how many, and which records (with the detail of each)."""
    by_reason: dict[str, list[Skip]] = defaultdict(list)
    for s in skipped:
        by_reason[s.reason].append(s)
    lines = []
    for reason, items in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        which = ", ".join(f"#{s.id}" + (f" ({s.detail})" if s.detail else "") for s in items)
        lines.append(f"  {len(items)} {reason}: {which}")
    return lines


def export(
    db: Path,
    spider_dir: Path,
    out: Path,
    timeout_s: float = 5.0,
    include_unattributed: bool = False,
) -> tuple[int, list[Skip]]:
    """Write the verified pairs of feedback database `db` to `out`; (pairs, skipped)."""
    if not db.is_file():
        raise FeedbackError(f"no feedback database at {db}")
    judgements = FeedbackStore(db).all()
    pairs, skipped = verified_pairs(judgements, spider_dir, timeout_s, include_unattributed)
    write_json(out, pairs)
    return len(pairs), skipped


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.feedback",
        description="Judgements stored by the server (--feedback-db) as training data.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    ex = commands.add_parser(
        "export",
        help="write the verified question/SQL pairs in Spider's train format",
        description="Write the answers marked right and the corrections that run on their "
        "database as a Spider train file (db_id, question, query); the latest judgement of "
        "a question stands. Says how many were skipped and why.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ex.add_argument("--db", required=True, type=Path, help="the server's --feedback-db file")
    ex.add_argument(
        "--spider", default=Path("data/raw/spider"), type=Path, help="the Spider release folder"
    )
    ex.add_argument(
        "--out", default=Path("data/feedback/verified.json"), type=Path, help="the file to write"
    )
    ex.add_argument(
        "--timeout-s", default=5.0, type=float, help="time limit of each query's check run"
    )
    ex.add_argument(
        "--include-unattributed",
        action="store_true",
        help="also export records that name no writer (stored before writers were recorded)",
    )
    return parser


def main(argv=None) -> int:
    from sqlrl.data.spider import SpiderDataError

    args = build_parser().parse_args(argv)
    try:
        n, skipped = export(
            args.db, args.spider, args.out, args.timeout_s, args.include_unattributed
        )
    except (FeedbackError, SpiderDataError) as exc:
        print(f"feedback: {exc}", file=sys.stderr)
        return 2
    print(
        f"exported {n} verified pair{'' if n == 1 else 's'} to {args.out}; skipped {len(skipped)}"
    )
    for line in skip_report(skipped):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
