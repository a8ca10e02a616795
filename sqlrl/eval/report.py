"""A pull-request report: what this revision changed against a baseline, as Markdown + PNGs.

    python -m sqlrl.eval.report --baseline main --out report/

- `dvc params diff` and `dvc metrics diff` as tables;
- EX/EM per evaluated model and per hardness, with deltas;
- EX per evaluation set (Spider dev and held-out, eval.sets) per model, greedy and maj@k;
- the dev questions whose verdict flipped (from data/predictions/, both predictions shown);
- plots rendered to PNG with matplotlib, because the HTML of `dvc plots show` needs a CDN and
  does not render offline: loss and reward over optimizer steps (raw and smoothed, both
  revisions), EX by hardness per model beside the baseline's, EX per set per model.
The workspace is the "new" side; the baseline is any git revision.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from sqlrl.benchmarks.spider import HARDNESS_LEVELS as HARDNESS

MODELS = {"base": "base", "sft": "SFT", "final": "GRPO (final)"}  # evaluate@<name> in dvc.yaml
CURVES = {  # title -> (dvclive plots file, relative to the repo root)
    "SFT loss": "dvclive/sft/plots/metrics/loss.tsv",
    "GRPO reward": "dvclive/grpo/plots/metrics/reward.tsv",
    "GRPO loss": "dvclive/grpo/plots/metrics/loss.tsv",
}
CURVE_METRICS = {"sft": "metrics/sft.json", "grpo": "metrics/grpo.json"}  # dvclive/<stage>/...
MAX_FLIPS = 30


def git_show(rev: str, path: str, root: str | Path = ".") -> str | None:
    """A file's text at `rev`, or None when it did not exist there."""
    proc = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True
    )
    return proc.stdout if proc.returncode == 0 else None


def workspace_text(path: str, root: str | Path = ".") -> str | None:
    p = Path(root) / path
    return p.read_text(encoding="utf-8") if p.is_file() else None


def _json_or_none(text: str | None) -> dict | None:
    return json.loads(text) if text else None


def by_split(metrics: dict | None) -> dict | None:
    """An evaluation's metrics as {"dev": ..., "heldout": ...}. Revisions before this layout
    kept dev's at the top level and held-out's under "heldout": a baseline may be one."""
    if not metrics or "dev" in metrics:
        return metrics
    return {"dev": metrics, **({"heldout": metrics["heldout"]} if "heldout" in metrics else {})}


def jsonl_rows(text: str | None) -> list[dict]:
    """The rows of a JSONL file's text (git_show's, workspace_text's); none for None."""
    return [json.loads(line) for line in (text or "").splitlines() if line.strip()]


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def _delta(new, old) -> str:
    if isinstance(new, (int, float)) and isinstance(old, (int, float)):
        d = new - old
        return f"{d:+.4g}" if d else "0"
    return ""


def dvc_diff_table(kind: str, baseline: str, root: str | Path = ".") -> str:
    """`dvc params diff --md` / `dvc metrics diff --md` against `baseline`, as DVC prints it."""
    run = subprocess.run(
        ["dvc", kind, "diff", baseline, "--md"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )
    if run.returncode != 0:
        raise ValueError(f"dvc {kind} diff {baseline} failed: {run.stderr.strip()}")
    return run.stdout.strip() + "\n" if run.stdout.strip() else f"No {kind} changed.\n"


def accuracy_table(old: dict[str, dict | None], new: dict[str, dict | None]) -> str:
    """EX/EM per stage and hardness, this revision vs baseline."""
    lines = ["| model | split | EX | ΔEX | EM | ΔEM | n |", "|---|---|---|---|---|---|---|"]
    for stage in MODELS:
        cur, base = by_split(new.get(stage)), by_split(old.get(stage)) or {}
        if not cur:
            continue
        held, held_base = cur.get("heldout") or {}, base.get("heldout") or {}
        dev, dev_base = cur["dev"], base.get("dev") or {}
        rows = [("dev", dev, dev_base), ("dev, non-trivial gold", *_nontrivial(dev, dev_base))]
        rows += [
            (h, dev.get("by_hardness", {}).get(h, {}), dev_base.get("by_hardness", {}).get(h, {}))
            for h in HARDNESS
        ]
        rows += [
            ("heldout", held, held_base),
            ("heldout, non-trivial gold", *_nontrivial(held, held_base)),
        ]
        for split, c, b in rows:
            if not c or not c.get("n"):
                continue
            lines.append(
                f"| {stage} | {split} | {_fmt(c.get('ex'))} | {_delta(c.get('ex'), b.get('ex'))}"
                f" | {_fmt(c.get('em'))} | {_delta(c.get('em'), b.get('em'))} | {c.get('n')} |"
            )
    return "\n".join(lines) + "\n"


def evaluation_sets(evals: dict[str, dict | None]) -> list[str]:
    """The splits and benchmark sets the models were scored on, in the order evaluated."""
    names: list[str] = []
    for metrics in evals.values():
        for name, split in (by_split(metrics) or {}).items():
            if isinstance(split, dict) and "n" in split and name not in names:
                names.append(name)  # not generation settings or comparisons
    return names


def benchmark_table(evals: dict[str, dict | None]) -> str:
    """One row per model, one column per set: greedy EX, and maj@k in brackets where the
    model was voted on; n and the skipped questions per set below the table."""
    sets = evaluation_sets(evals)
    lines = [
        "| model | " + " | ".join(sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    for stage, label in MODELS.items():
        splits = by_split(evals.get(stage))
        if not splits:
            continue
        cells = []
        for name in sets:
            split = splits.get(name) or {}
            maj = split.get("maj")
            cells.append(
                _pct(split.get("ex")) + (f" (maj@{maj['k']} {_pct(maj['ex'])})" if maj else "")
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    first = {  # each set's counts, from the first model scored on it
        name: next(by_split(m)[name] for m in evals.values() if name in (by_split(m) or {}))
        for name in sets
    }
    counts = ", ".join(
        f"{name} {split['n']} scored"
        + (f" ({split['skipped']} skipped)" if split.get("skipped") else "")
        for name, split in first.items()
    )
    return "\n".join(lines) + f"\n\nQuestions: {counts}.\n"


def _pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _nontrivial(cur: dict, base: dict) -> tuple[dict, dict]:
    """EX on the questions whose gold result is not empty or only 0/NULL (no EM: not split)."""

    def view(m: dict) -> dict:
        if m.get("ex_nontrivial") is None:
            return {}
        return {"ex": m["ex_nontrivial"], "n": m.get("n", 0) - m.get("n_trivial_gold", 0)}

    return view(cur), view(base)


def flipped_questions(old_rows: list[dict], new_rows: list[dict]) -> list[dict]:
    """Dev questions whose EX verdict changed between two prediction files (same order)."""
    flips = []
    for i, (o, n) in enumerate(zip(old_rows, new_rows, strict=False)):
        if o.get("question") != n.get("question"):
            raise ValueError(f"prediction files disagree on question #{i}: the dev set changed")
        if o.get("ex") != n.get("ex") and None not in (o.get("ex"), n.get("ex")):
            flips.append(
                {
                    "index": i,
                    "question": n["question"],
                    "gold": n.get("gold"),
                    "old": o.get("pred"),
                    "new": n.get("pred"),
                    "now": "fixed" if n["ex"] else "broken",
                }
            )
    return flips


def flips_section(stage: str, flips: list[dict], baseline: str) -> str:
    if not flips:
        return f"No dev verdict flipped for `{stage}`.\n"
    fixed = sum(f["now"] == "fixed" for f in flips)
    lines = [
        f"`{stage}`: {fixed} fixed, {len(flips) - fixed} broken "
        f"(showing {min(len(flips), MAX_FLIPS)}).",
        "",
        f"| # | now | question | gold | {baseline} | this revision |",
        "|---|---|---|---|---|---|",
    ]
    for f in flips[:MAX_FLIPS]:
        cells = [
            str(f["index"]),
            f["now"],
            f["question"],
            f"`{f['gold']}`",
            f"`{f['old']}`",
            f"`{f['new']}`",
        ]
        lines.append(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
        )
    return "\n".join(lines) + "\n"


def _read_curve(text: str | None) -> tuple[list[float], list[float]]:
    if not text:
        return [], []
    rows = list(csv.DictReader(io.StringIO(text), delimiter="\t"))
    if not rows:
        return [], []
    value_key = [k for k in rows[0] if k not in ("step", "timestamp")][0]
    return [float(r["step"]) for r in rows], [float(r[value_key]) for r in rows]


def optimizer_steps(
    curve_path: str, points: list[float], metrics_path: str, text_of
) -> list[float] | None:
    """The optimizer step of each of a DVCLive curve's `points` (its step column). DVCLive
    numbers points by log (0, 1, 2, ...), so a curve logged every 50 steps would show 47
    points over 0-46; the trainer's epoch at that log (epoch.tsv beside it), times the stage's
    steps per epoch (its metrics file; GRPO, which logs every step, reaches its last step at
    its last log), gives the step itself. None when a file or a point's epoch is missing."""
    log_steps, epochs = _read_curve(text_of(str(Path(curve_path).with_name("epoch.tsv"))))
    metrics = _json_or_none(text_of(metrics_path))
    if not epochs or not metrics or not metrics.get("steps"):
        return None
    epoch_at = dict(zip(log_steps, epochs, strict=True))
    if not all(point in epoch_at for point in points):
        return None
    per_epoch = metrics["steps"] / (metrics.get("epochs") or max(epochs))
    return [round(epoch_at[point] * per_epoch) for point in points]


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` points: a reward curve of one batch per step is mostly
    noise, and the trend is what a reviewer reads."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _curve(path: str, rev_text) -> tuple[list[float], list[float]]:
    """A curve's (optimizer steps, values) as one revision holds it."""
    steps, values = _read_curve(rev_text(path))
    metrics_path = CURVE_METRICS.get(path.split("/")[1])
    real = optimizer_steps(path, steps, metrics_path, rev_text) if metrics_path else None
    return real or steps, values


def render_plots(
    out_dir: Path, baseline: str, new_evals: dict, root: str | Path = ".", old_evals=None
) -> list[str]:
    """PNG files for the report; returns their names (only the plots that have data).
    Curves: this revision and the baseline over optimizer steps, each a faint raw line under a
    smoothed one; EX by hardness: each model's bars beside the baseline's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    revisions = {
        "this revision": lambda path: workspace_text(path, root),
        baseline: lambda path: git_show(baseline, path, root),
    }
    for title, path in CURVES.items():
        curves = {label: _curve(path, text_of) for label, text_of in revisions.items()}
        if not any(steps for steps, _ in curves.values()):
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for (label, (steps, values)), color in zip(curves.items(), ("C0", "C1"), strict=False):
            if not steps:
                continue
            window = len(values) // 20 if len(values) >= 60 else 1  # a few points: as they are
            ax.plot(steps, values, color=color, alpha=0.25 if window > 1 else 1.0, linewidth=0.8)
            if window > 1:
                ax.plot(
                    steps,
                    smoothed(values, window),
                    color=color,
                    label=f"{label} (mean of {window})",
                )
            else:
                ax.lines[-1].set_label(label)
        ax.set(title=title, xlabel="optimizer step")
        ax.legend()
        name = title.lower().replace(" ", "_") + ".png"
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=100)
        plt.close(fig)
        names.append(name)
    stages = [s for s in MODELS if new_evals.get(s)]
    if stages:
        fig, ax = plt.subplots(figsize=(7, 3.8))
        width = 0.8 / (2 * len(stages))
        for k, stage in enumerate(stages):
            for j, (evals, label, style) in enumerate(
                (
                    (
                        (old_evals or {}).get(stage),
                        f"{MODELS[stage]} ({baseline})",
                        dict(alpha=0.35),
                    ),
                    (new_evals[stage], MODELS[stage], {}),
                )
            ):
                by = (by_split(evals) or {}).get("dev", {}).get("by_hardness", {})
                if not by:
                    continue
                ax.bar(
                    [i + (2 * k + j) * width for i in range(len(HARDNESS))],
                    [by.get(h, {}).get("ex") or 0 for h in HARDNESS],
                    width,
                    label=label,
                    color=f"C{k}",
                    **style,
                )
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(HARDNESS))], HARDNESS)
        top = max([b.get_height() for b in ax.patches] + [0.05])
        ax.set(title=f"Dev EX by hardness: this revision vs {baseline} (faint)", ylabel="EX")
        ax.set_ylim(0, min(1.0, top * 1.3))
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out_dir / "ex_by_hardness.png", dpi=100)
        plt.close(fig)
        names.append("ex_by_hardness.png")
    if stages and evaluation_sets(new_evals):
        names.append(_plot_sets(plt, out_dir, new_evals, stages))
    return names


def _plot_sets(plt, out_dir: Path, evals: dict, stages: list[str]) -> str:
    """Greedy EX per evaluation set, one bar per model (its benchmark's own EX rule)."""
    sets = evaluation_sets(evals)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(stages)
    for k, stage in enumerate(stages):
        splits = by_split(evals[stage]) or {}
        ax.bar(
            [i + k * width for i in range(len(sets))],
            [(splits.get(name) or {}).get("ex") or 0 for name in sets],
            width,
            label=MODELS[stage],
            color=f"C{k}",
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(sets))], sets, fontsize=8)
    top = max([b.get_height() for b in ax.patches] + [0.05])
    ax.set(title="EX per evaluation set (greedy; each set by its benchmark's rule)", ylabel="EX")
    ax.set_ylim(0, min(1.0, top * 1.3))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "ex_by_set.png", dpi=100)
    plt.close(fig)
    return "ex_by_set.png"


def build_report(baseline: str, out_dir: Path, root: str | Path = ".") -> Path:
    """Write out_dir/report.md (+ PNGs) comparing the workspace with `baseline`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if (
        subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{baseline}^{{commit}}"],
            cwd=root,
            capture_output=True,
        ).returncode
        != 0
    ):
        raise ValueError(f"baseline {baseline!r} is not a git revision of {root}")
    new_evals = {s: _json_or_none(workspace_text(f"metrics/eval_{s}.json", root)) for s in MODELS}
    old_evals = {
        s: _json_or_none(git_show(baseline, f"metrics/eval_{s}.json", root)) for s in MODELS
    }
    parts = [
        f"# Pipeline report: this revision vs `{baseline}`\n",
        "## Accuracy on Spider dev (EX: execution, EM: exact set match)\n",
        accuracy_table(old_evals, new_evals),
        "## EX per evaluation set (greedy; maj@k where voted)\n",
        benchmark_table(new_evals),
        "## Parameters (`dvc params diff`)\n",
        dvc_diff_table("params", baseline, root),
        "## Metrics (`dvc metrics diff`)\n",
        dvc_diff_table("metrics", baseline, root),
        "## Dev questions whose verdict flipped\n",
    ]
    for stage in MODELS:
        path = f"data/predictions/{stage}.jsonl"
        new_rows, old_rows = (
            jsonl_rows(workspace_text(path, root)),
            jsonl_rows(git_show(baseline, path, root)),
        )
        if new_rows and old_rows:
            parts.append(flips_section(stage, flipped_questions(old_rows, new_rows), baseline))
    plots = render_plots(out_dir, baseline, new_evals, root, old_evals)
    if plots:
        parts.append("## Plots\n")
        parts += [f"![{name}]({name})\n" for name in plots]
    report = out_dir / "report.md"
    report.write_text("\n".join(parts), encoding="utf-8")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.eval.report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--baseline", default="main", help="git revision to compare against")
    parser.add_argument("--out", default="report", type=Path, help="output folder")
    args = parser.parse_args(argv)
    try:
        path = build_report(args.baseline, args.out)
    except ValueError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
