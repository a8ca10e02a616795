"""Time extract_sql on megabytes of one repeated token, at two sizes: is it linear?

    python benchmarks/bench_extract.py [--size 1000000] [--repeats 3]

A runaway generation can fill its whole budget with one token; extraction must stay linear
in the text. Each shape of tests/sql/test_extract.py's MEGABYTES is timed at about `size`
characters and at twice that (best of `repeats`); the ratio is about 2 for linear work and 4
for quadratic. tests/sql/test_extract.py checks the bounded number of cut points; this
measures the time (a few tenths of a second a megabyte on a 2-core CPU when this was written).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root

from sqlrl.sql.extract import extract_sql  # noqa: E402

# (repeated unit, tail): the shapes of tests/sql/test_extract.py's MEGABYTES
SHAPES = {
    "semicolons": (";", ""),
    "blank lines": ("\n\n", ""),
    "spaces": (" ", "x"),
    "select": ("select ", ""),
    "stacked": ("SELECT 1;", ""),
    "fences": ("```", ""),
    "labels": ("sql:", ""),
}


def best_time(text: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        extract_sql(text)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="characters, about")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'shape':12} {'chars':>9} {'s':>7} {'2x chars':>9} {'s':>7} {'ratio':>6}")
    worst = 0.0
    for name, (unit, tail) in SHAPES.items():
        n = max(1, args.size // len(unit))
        small, large = unit * n + tail, unit * (2 * n) + tail
        t1, t2 = best_time(small, args.repeats), best_time(large, args.repeats)
        worst = max(worst, t2 / max(t1, 1e-9))
        print(f"{name:12} {len(small):9} {t1:7.3f} {len(large):9} {t2:7.3f} {t2 / t1:6.1f}")
    print(f"worst ratio {worst:.1f} (2: linear, 4: quadratic)")


if __name__ == "__main__":
    main()
