"""Is model B better than model A on the same questions? A paired bootstrap of EX.

Both prediction files list the same questions in the same order (data/predictions/<name>.jsonl);
items skipped by either (absent database) are left out. The interval is the 2.5 and 97.5
percentiles of the mean per-question difference over seeded resamples of the questions: when
it excludes zero, the difference is unlikely to be an accident of which questions were asked.
"""

from __future__ import annotations

import argparse

import numpy as np

from sqlrl.jsonio import read_jsonl, write_json

RESAMPLES = 10_000


def paired_bootstrap(
    baseline: list[int | None],
    candidate: list[int | None],
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> dict:
    """Mean EX difference (candidate - baseline) and its 95% bootstrap interval."""
    if len(baseline) != len(candidate):
        raise ValueError(f"cannot pair {len(baseline)} baseline items with {len(candidate)}")
    pairs = [
        (b, c) for b, c in zip(baseline, candidate, strict=False) if b is not None and c is not None
    ]
    if not pairs:
        return {"n": 0, "diff": None, "ci95": None, "excludes_zero": False}
    diffs = np.array([c - b for b, c in pairs], dtype=float)
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "n": len(pairs),
        "diff": round(float(diffs.mean()), 4),
        "ci95": [round(float(low), 4), round(float(high), 4)],
        "excludes_zero": bool(low > 0 or high < 0),
        "wins": int((diffs > 0).sum()),
        "losses": int((diffs < 0).sum()),
    }


def compare_predictions(
    baseline_rows: list[dict], candidate_rows: list[dict], seed: int = 0
) -> dict:
    """paired_bootstrap over two prediction files, checking they ask the same questions; under
    `nontrivial`, the same on the questions whose gold result is not trivial (`gold_trivial`)."""
    for i, (b, c) in enumerate(zip(baseline_rows, candidate_rows, strict=False)):
        if (b["question"], b["db_id"]) != (c["question"], c["db_id"]):
            raise ValueError(f"prediction files differ at item {i}: not the same questions")
    result = paired_bootstrap(
        [r["ex"] for r in baseline_rows], [r["ex"] for r in candidate_rows], seed
    )
    telling = [
        (b, c)
        for b, c in zip(baseline_rows, candidate_rows, strict=False)
        if not (b.get("gold_trivial") or c.get("gold_trivial"))
    ]
    if len(telling) < len(baseline_rows):
        result["nontrivial"] = paired_bootstrap(
            [b["ex"] for b, _ in telling], [c["ex"] for _, c in telling], seed
        )
    return result


def _ex(rows: list[dict]) -> float | None:
    scored = [r["ex"] for r in rows if r.get("ex") is not None]
    return round(sum(scored) / len(scored), 4) if scored else None


def compare_files(pairs: list[tuple[str, str]], seed: int = 0) -> dict:
    """{candidate file: its EX, the baseline's, and compare_predictions} for each (baseline,
    candidate) pair of prediction files: the same interval the evaluate stage writes as
    `vs_<name>`, for any two runs (a setting's effect, a seed's)."""
    report = {}
    for baseline, candidate in pairs:
        b_rows, c_rows = read_jsonl(baseline), read_jsonl(candidate)
        report[candidate] = {
            "baseline": baseline,
            "baseline_ex": _ex(b_rows),
            "candidate_ex": _ex(c_rows),
            **compare_predictions(b_rows, c_rows, seed),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.eval.compare",
        description="Paired bootstrap of EX between prediction files (data/predictions/*.jsonl "
        "of two runs): BASELINE CANDIDATE [BASELINE CANDIDATE ...]",
    )
    parser.add_argument("files", nargs="+", help="pairs: baseline.jsonl candidate.jsonl ...")
    parser.add_argument("--out", help="write the report as JSON here")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    args = parser.parse_args(argv)
    if len(args.files) % 2:
        parser.error(f"give pairs of files (baseline candidate); got {len(args.files)} files")
    pairs = list(zip(args.files[::2], args.files[1::2], strict=True))
    try:
        report = compare_files(pairs, args.seed)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return 1
    for candidate, r in report.items():
        ci = r["ci95"] or [0, 0]
        print(
            f"{candidate}: EX {r['baseline_ex']:.1%} -> {r['candidate_ex']:.1%}, "
            f"{r['diff']:+.1%} [{ci[0]:+.1%}, {ci[1]:+.1%}] on {r['n']} "
            f"({r['wins']} won, {r['losses']} lost)"
        )
    if args.out:
        write_json(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
