"""Check that a change to the sandbox leaves every real query's verdict as it was.

    python benchmarks/check_verdicts.py save before.pkl     # on the old code
    python benchmarks/check_verdicts.py compare before.pkl  # on the new code

The queries: every Spider gold query (train_spider, train_others, dev) and every model query
in data/predictions/*.jsonl (the scored prediction, the raw output's extracted SQL and the SQL
before schema repair), each run by sqlrl.sql.executor with the evaluation time limit. `compare`
prints how many verdicts (status, rows, columns, error text) are identical, and each that is
not. `save` also prints the largest VDBE program and result width among them.
"""

from __future__ import annotations

import json
import pickle
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.sql.executor import ExecLimits, SQLExecutor  # noqa: E402
from sqlrl.sql.extract import extract_sql  # noqa: E402

SPIDER = ROOT / "data/raw/spider"


def queries() -> list[tuple[Path, str]]:
    """(database, SQL) for every gold query, then every distinct model query per item."""
    found = []
    for name in ("train_spider.json", "train_others.json", "dev.json"):
        found += [(d["db_id"], d["query"]) for d in json.loads((SPIDER / name).read_text())]
    for path in sorted((ROOT / "data/predictions").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            item = json.loads(line)
            sqls = [item["pred"], extract_sql(item["output"]), item.get("before_repair") or ""]
            found += [(item["db_id"], sql) for sql in dict.fromkeys(sqls)]
    return [(SPIDER / "database" / db / f"{db}.sqlite", sql) for db, sql in found]


def program_sizes(items) -> tuple[int, int]:
    """The most VDBE ops and result columns of any query that prepares on a plain connection."""
    ops = columns = 0
    for db, sql in items:
        if not db.is_file():
            continue
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            ops = max(ops, len(conn.execute("EXPLAIN " + sql).fetchall()))
            columns = max(columns, len(conn.execute(sql).description or ()))
        except (sqlite3.Error, ValueError):
            pass
        finally:
            conn.close()
    return ops, columns


def main() -> None:
    mode, path = sys.argv[1], Path(sys.argv[2])
    items = queries()
    executor = SQLExecutor(ExecLimits(timeout_s=10.0))
    start = time.monotonic()
    verdicts = [executor.execute(db, sql) for db, sql in items]
    statuses = {
        s: sum(v.status == s for v in verdicts) for s in ("ok", "error", "timeout", "skipped")
    }
    print(f"{len(items)} queries in {time.monotonic() - start:.1f} s: {statuses}")
    if mode == "save":
        path.write_bytes(pickle.dumps(verdicts))
        print("largest program %d VDBE ops, widest result %d columns" % program_sizes(items))
        return
    before = pickle.loads(path.read_bytes())
    print(
        f"identical {sum(a == b for a, b in zip(before, verdicts, strict=False))}/{len(verdicts)}"
    )
    for (db, sql), old, new in zip(items, before, verdicts, strict=False):
        if old != new:
            print(
                f"DIFF {db.stem}: {sql[:100]!r} {old.status} {old.error[:60]!r} -> "
                f"{new.status} {new.error[:60]!r}"
            )


if __name__ == "__main__":
    main()
