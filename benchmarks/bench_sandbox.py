"""Hostile SQL against the sandbox: wall time against the limit, and peak memory.

    python benchmarks/bench_sandbox.py [--timeout 1] [--only NAME]

Each query of ADVERSARIAL runs in a fresh process (so peak memory is its own) on
concert_singer, with `--timeout` as the limit; the table shows the verdict, the wall time of
the query, how far it ran past the limit, and the process's peak RSS growth. The executor's
bound (sqlrl/sql/executor.py) is the limit plus a fraction of a second and 256 MB per query.
Run it by hand: it takes about a minute, mostly waiting out the limit.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DB = ROOT / "data/raw/spider/database/concert_singer/concert_singer.sqlite"


def _calls(template: str, n: int, sep: str = ", ") -> str:
    return sep.join(template.format(i=i) for i in range(n))


def _many(template: str, n: int) -> str:
    """n calls in one expression of one row: max() of up to 100 calls, of up to 100 of those
    (a column list would hit the column limit, a chain of operators the depth limit)."""
    groups = [f"max({_calls(template, min(100, n - k))}, 0)" for k in range(0, n, 100)]
    return f"max({', '.join(groups)}, 0)"


def _filled(head: str, template: str, tail: str = " FROM s") -> str:
    """head + as many calls of `template` in one row as the sandbox lets one statement hold
    (10,000 characters, 10,000 VDBE ops; SQLite's own program is probed with EXPLAIN)."""
    probe = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    probe.setlimit(sqlite3.SQLITE_LIMIT_VDBE_OP, 10_000)
    probe.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10_000)

    def fits(n: int) -> bool:
        sql = head + _many(template, n) + tail
        try:
            return len(sql) <= 10_000 and bool(probe.execute("EXPLAIN " + sql).fetchall())
        except (sqlite3.Error, MemoryError):
            return False

    n = 1
    while fits(2 * n):
        n *= 2
    step = n // 2
    while step:
        if fits(n + step):
            n += step
        step //= 2
    probe.close()
    return head + _many(template, n) + tail


# One row of long values (under the 10k row limit), read from a table so that nothing is a
# constant SQLite could compute once: t, 5k 'a'; p and g, LIKE and GLOB patterns that make
# them compare t at every offset (1,000 characters: the pattern limit); n, a needle that
# memcmp compares in full at every offset; c, a trim set whose last character is t's (801:
# SQLite's trim allocates 12 bytes a character of it, under the length limit).
LONG = (
    "WITH s(t, p, g, n, c) AS (SELECT replace(hex(zeroblob(2500)), '0', 'a') || "
    "substr(Name, 1, 0), '%' || replace(hex(zeroblob(499)), '0', 'a') || 'b', "
    "'*' || replace(hex(zeroblob(499)), '0', 'a') || 'b', "
    "replace(hex(zeroblob(500)), '0', 'a') || 'b', "
    "replace(hex(zeroblob(400)), '0', 'b') || 'a' FROM singer LIMIT 1) "
)
ADVERSARIAL = {
    # the examples, one call and many in one row
    "like x1": LONG + "SELECT t LIKE p FROM s",
    "like, many in one row": _filled(LONG + "SELECT ", "t LIKE p"),
    "glob, many in one row": _filled(LONG + "SELECT ", "t GLOB g"),
    "like escape, many": _filled(LONG + "SELECT ", "t LIKE p ESCAPE '!'"),
    "like in where, cartesian": LONG + "SELECT count(*) FROM s, singer a, singer b, singer c "
    "WHERE t || a.Name LIKE p OR t || b.Name GLOB g",
    "like flattened 100x100": LONG + ", f AS (SELECT " + _many("t LIKE p", 100) + " AS c FROM s)"
    " SELECT " + _many("c", 100) + " FROM f",
    "like flattened 20x100": LONG + ", f AS (SELECT " + _many("t LIKE p", 20) + " AS c FROM s)"
    " SELECT " + _many("c", 100) + " FROM f",
    "instr flattened 20x100": LONG
    + ", f AS (SELECT "
    + _many("instr(t, n)", 20)
    + " AS c FROM s) SELECT "
    + _many("c", 100)
    + " FROM f",
    "printf %.*c 2**31": "SELECT printf('%.*c', 2147483647, 'x')",
    "printf %.*c negative": "SELECT printf('%.*c', -2147483647, 'x')",
    "printf literal precision": "SELECT printf('%5.2147483647c', 'x')",
    "format %.*c, many": _filled("SELECT ", "length(format('%d%.*c', {i}, 2147483647, 'x'))", ""),
    "printf %.*f 2**31": "SELECT printf('%.*f', 2147483647, 1.5)",
    "mixed built-ins, many": _filled(
        LONG + "SELECT ",
        "max(t LIKE p, instr(t, n), "
        "length(replace(t, n, 1)), length(trim(t, c)), "
        "printf('%.*c', 2147483647, t), t GLOB g)",
    ),
    "trim, many": _filled(LONG + "SELECT ", "length(rtrim(t, c || {i}))"),
    "instr, many": _filled(LONG + "SELECT ", "instr(t || {i}, n)"),
    "replace, many": _filled(LONG + "SELECT ", "length(replace(t, n, {i}))"),
    "json, many": _filled(LONG + "SELECT ", "json_extract('[\"' || t || '\",{i}]', '$[1]')"),
    "length(upper()), many": _filled(
        LONG + "SELECT ", "length(upper(t || {i})) + unicode(lower(t || {i}))"
    ),
    "runaway recursion": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
    "SELECT count(*) FROM r",
    "11-way cartesian product": "SELECT count(*) FROM " + _calls("singer t{i}", 11),
    "sort in memory": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
    "SELECT i FROM r ORDER BY random() LIMIT 1",
    "sort of 2M rows in memory": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
    "FROM r WHERE i < 2000000) SELECT NULL FROM r ORDER BY random()",
    "distinct temp table": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
    "SELECT count(DISTINCT hex(randomblob(64)) || i) FROM r",
    "wide rows": "SELECT " + _calls("z", 2000, ",") + " FROM (SELECT zeroblob(99000) AS z), singer",
    "wide rows under the caps": "SELECT "
    + _calls("z", 199, ",")
    + " FROM (SELECT zeroblob(9999) AS z)",
    "many rows of ints and NULLs": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
    "FROM r WHERE i < 99999) SELECT " + _calls("i, NULL", 90) + " FROM r",
    "60-table join": "SELECT count(*) FROM "
    + _calls("singer t{i}", 60)
    + " WHERE "
    + _calls("t{i}.singer_id = t0.age", 60, " AND "),
}

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from sqlrl.sql.executor import ExecLimits, SQLExecutor
executor = SQLExecutor(ExecLimits(timeout_s={timeout}))
executor.execute({db!r}, "SELECT 1")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
verdict = executor.execute({db!r}, sys.stdin.read())
wall = time.monotonic() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print(json.dumps([verdict.status, verdict.error[:60], wall, peak / 1024]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--only", default=None, help="run the queries whose name has this")
    args = parser.parse_args()
    child = CHILD.format(root=str(ROOT), timeout=args.timeout, db=str(DB))
    worst = 0.0
    print(f"{'query':30} {'verdict':8} {'wall s':>7} {'over s':>7} {'peak MB':>8}  reason")
    for name, sql in ADVERSARIAL.items():
        if args.only and args.only not in name:
            continue
        out = subprocess.run(
            [sys.executable, "-c", child], input=sql, capture_output=True, text=True, timeout=600
        )
        if out.returncode:
            print(f"{name:30} crashed: {out.stderr.strip()[-200:]}")
            continue
        status, reason, wall, peak = json.loads(out.stdout)
        worst = max(worst, wall)
        print(
            f"{name:30} {status:8} {wall:7.2f} {max(0.0, wall - args.timeout):7.2f} "
            f"{peak:8.0f}  {reason}"
        )
    print(f"worst wall time {worst:.2f} s with a {args.timeout:g} s limit")


if __name__ == "__main__":
    main()
