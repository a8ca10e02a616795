"""Claims that survive a reseed: GRPO's gain over SFT per run and across runs.

    dvc exp run --queue -S 'grpo.seed=range(42,45)' && dvc queue start   # then, when done:
    python -m sqlrl.eval.seeds $(dvc exp ls --name-only) --out docs/seeds

One run's paired interval says how sure we are of *that* run's gain; another GRPO seed on the
same SFT model can land anywhere in a range as wide as the interval itself (docs/seeds.md).
So for each run (a DVC experiment or any git revision holding a finished pipeline) and each
evaluation set, this reads the final and SFT prediction files the evaluate stage committed
and writes:
- each run's EX and its paired bootstrap against its own SFT model (sqlrl.eval.compare's,
  seeded with the run's `seed` as the evaluate stage seeds it, so dev and held-out equal the
  run's own `vs_sft` in metrics/eval_final.json);
- the across-seed estimate: each question's EX averaged over the runs, against the SFT
  models' (one shared model in a GRPO-only sweep), by the same paired bootstrap, and the
  range of the runs' own gains beside it.
Greedy decoding and maj@k (the sets a model was voted on) are reported apart, each labelled.
Out: seeds.json (diffable), seeds.md (the table) and seeds.png (the plot) in --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sqlrl.eval.compare import RESAMPLES, paired_bootstrap
from sqlrl.eval.report import git_show, jsonl_rows
from sqlrl.jsonio import write_json

# the evaluate stage's prediction files (dvc.yaml's evaluate@sft and evaluate@final outs)
SPLIT_FILES = {
    "dev": "data/predictions/{model}.jsonl",
    "heldout": "data/predictions/{model}_heldout.jsonl",
}
SET_FILE = "data/predictions/{model}_sets/{name}.jsonl"


class SeedReportError(ValueError):
    """The runs given cannot be reported together: a missing file, different questions."""


@dataclass
class Run:
    """One finished pipeline as a revision holds it: the seeds it used and, per evaluation
    set, the SFT and final models' prediction rows."""

    name: str
    rev: str
    seeds: dict
    bootstrap_seed: int
    sets: dict[str, tuple[list[dict], list[dict]]] = field(default_factory=dict)
    maj_k: dict[str, int] = field(default_factory=dict)


def resolve(name: str, root: str | Path = ".") -> str:
    """The commit of a DVC experiment name (`dvc exp show`'s), an exp ref, or a git revision."""
    from dvc.repo.experiments.utils import resolve_name
    from dvc.scm import SCM

    scm = SCM(str(root))
    ref = resolve_name(scm, name).get(name)
    if ref is not None:
        return scm.get_ref(str(ref))
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SeedReportError(f"{name!r} is neither a DVC experiment nor a git revision here")
    return proc.stdout.strip()


def load_run(name: str, root: str | Path = ".") -> Run:
    """A run's seeds and prediction rows at its revision. Its seeds are the ones the grpo
    stage recorded (metrics/grpo.json); a revision from before it recorded them gives its
    params'. Metrics that disagree with params mean an unfinished or stale run: refused."""
    rev = resolve(name, root)

    def text(path: str, required: bool = True) -> str | None:
        found = git_show(rev, path, root)
        if found is None and required:
            raise SeedReportError(f"{name} ({rev[:7]}) has no {path}: not a finished pipeline run")
        return found

    params = yaml.safe_load(text("params.yaml"))
    asked = {"pipeline": params["seed"], "grpo": params["grpo"].get("seed", params["seed"])}
    recorded = json.loads(text("metrics/grpo.json")).get("seeds", asked)
    if recorded != asked:
        raise SeedReportError(
            f"{name} ({rev[:7]}): metrics/grpo.json records seeds {recorded}, its params.yaml "
            f"asks {asked}: the run is stale (dvc status)"
        )
    evals = json.loads(text("metrics/eval_final.json"))
    run = Run(name, rev, recorded, params["seed"])
    files = dict(SPLIT_FILES)
    files.update({s: SET_FILE.replace("{name}", s) for s in params["eval"].get("sets", {})})
    for split, path in files.items():
        sft, final = (jsonl_rows(text(path.format(model=m))) for m in ("sft", "final"))
        if not final:  # an empty held-out split (prepare.heldout_fraction 0)
            continue
        run.sets[split] = (sft, final)
        if "maj" in evals.get(split, {}):
            run.maj_k[split] = evals[split]["maj"]["k"]
    return run


def _values(rows: list[dict], key: str) -> list[float | None]:
    """Each question's verdict (1/0), None where it was not scored (an absent database)."""
    return [row.get(key) for row in rows]


def _ex(values: list[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return round(sum(scored) / len(scored), 4) if scored else None


def _mean_per_question(columns: list[list[float | None]]) -> list[float | None]:
    """Each question's verdict averaged over the runs; None where any run did not score it."""
    return [
        None if None in answers else sum(answers) / len(answers)
        for answers in zip(*columns, strict=True)
    ]


def gain(sft: list[float | None], final: list[float | None], seed: int) -> dict:
    """EX of both and the paired bootstrap of final - SFT (sqlrl.eval.compare's)."""
    return {"sft_ex": _ex(sft), "ex": _ex(final), **paired_bootstrap(sft, final, seed)}


def across_seeds(pairs: list[tuple[list, list]], seed: int) -> dict:
    """The runs' (SFT, final) verdicts on the same questions -> the gain of the per-question
    average over the runs, by the same paired bootstrap; `sft_shared` when every run has the
    same SFT verdicts (a GRPO-only sweep: then it is the one SFT model's own EX)."""
    sft = _mean_per_question([s for s, _ in pairs])
    final = _mean_per_question([f for _, f in pairs])
    shared = all(s == pairs[0][0] for s, _ in pairs)
    return {"runs": len(pairs), "sft_shared": shared, **gain(sft, final, seed)}


def _questions(rows: list[dict]) -> list[tuple]:
    return [(row["question"], row["db_id"]) for row in rows]


def seed_report(runs: list[Run]) -> dict:
    """{runs: name -> rev and seeds, sets: set -> decoding -> {runs: name -> gain,
    across_seeds}}: every set every run was evaluated on, greedy and (where every run voted
    on it) maj@k."""
    if not runs:
        raise SeedReportError("no runs given")
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        raise SeedReportError(f"a run is named twice: {names}")
    revs = {}
    for run in runs:
        if run.rev in revs:  # one run counted twice would narrow the across-seed interval
            raise SeedReportError(f"{revs[run.rev]} and {run.name} are the same commit")
        revs[run.rev] = run.name
    splits = list(runs[0].sets)
    for run in runs[1:]:
        if list(run.sets) != splits:
            raise SeedReportError(
                f"{run.name} was evaluated on {list(run.sets)}, {runs[0].name} on {splits}"
            )
    report = {
        "runs": {run.name: {"rev": run.rev, "seeds": run.seeds} for run in runs},
        "bootstrap": {
            "resamples": RESAMPLES,
            "seed": runs[0].bootstrap_seed,
            "per_run_seed": "each run's own `seed`, as its evaluate stage's vs_sft",
        },
        "sets": {},
    }
    for split in splits:
        questions = _questions(runs[0].sets[split][1])
        for run in runs:
            for model, rows in zip(("sft", "final"), run.sets[split], strict=True):
                if _questions(rows) != questions:
                    raise SeedReportError(
                        f"{run.name}'s {model} predictions on {split} do not ask "
                        f"{runs[0].name}'s final questions in the same order"
                    )
        report["sets"][split] = {}
        ks = {run.maj_k.get(split) for run in runs}
        decodings = {"greedy": "ex"}
        if len(ks) == 1 and None not in ks:
            decodings[f"maj@{ks.pop()}"] = "maj_ex"  # the voted answer's verdict
        for label, key in decodings.items():
            pairs = [tuple(_values(rows, key) for rows in run.sets[split]) for run in runs]
            report["sets"][split][label] = _decoding(runs, pairs)
    return report


def _decoding(runs: list[Run], pairs: list[tuple[list, list]]) -> dict:
    """One set and decoding: each run's gain and the across-seed one, with the range of the
    runs' own gains. maj@k of a final model whose SFT model was not voted on
    (eval.vote_models) has no pair: its EX alone."""
    if any(all(v is None for v in sft) for sft, _ in pairs):
        finals = [final for _, final in pairs]
        return {
            "runs": {run.name: {"ex": _ex(f)} for run, f in zip(runs, finals, strict=True)},
            "across_seeds": {"runs": len(runs), "ex": _ex(_mean_per_question(finals))},
            "note": "the SFT model was not voted on (eval.vote_models): EX only",
        }
    own = {
        run.name: gain(sft, final, run.bootstrap_seed)
        for run, (sft, final) in zip(runs, pairs, strict=True)
    }
    across = across_seeds(pairs, runs[0].bootstrap_seed)
    diffs = [r["diff"] for r in own.values()]
    across["range"] = None if None in diffs else [min(diffs), max(diffs)]
    return {"runs": own, "across_seeds": across}


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _points(result: dict) -> str:
    """A gain in EX points with its interval: +2.7 [+1.0, +4.2]."""
    if result.get("diff") is None:
        return "—"
    low, high = result["ci95"]
    return f"{100 * result['diff']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def _cell(result: dict) -> str:
    if "diff" not in result:
        return _pct(result["ex"])
    return f"{_pct(result['ex'])} (SFT {_pct(result['sft_ex'])}): {_points(result)}"


def markdown(report: dict) -> str:
    """One row per set and decoding: each run's EX and gain over its SFT model, the
    across-seed gain, and the range of the runs' own gains (EX points, 95% intervals)."""
    runs = report["runs"]
    heads = [f"{name} (grpo.seed {run['seeds']['grpo']})" for name, run in runs.items()]
    lines = [
        f"| set | decoding | {' | '.join(heads)} | across {len(runs)} runs | runs' gains |",
        "|---|---|" + "---|" * (len(runs) + 2),
    ]
    for split, decodings in report["sets"].items():
        for label, result in decodings.items():
            cells = [_cell(result["runs"][name]) for name in runs]
            across = result["across_seeds"]
            spread = across.get("range")
            spread = f"{100 * spread[0]:+.1f} to {100 * spread[1]:+.1f}" if spread else "—"
            lines.append(
                f"| {split} | {label} | {' | '.join(cells)} | {_cell(across)} | {spread} |"
            )
    return (
        "EX per run and across runs: each run against its own SFT model, paired bootstrap 95% "
        "interval in EX points; across runs, each question's EX averaged over the runs "
        "(python -m sqlrl.eval.seeds, docs/seeds.md).\n\n" + "\n".join(lines) + "\n"
    )


def plot(report: dict, path: Path) -> None:
    """Each run's gain over SFT with its interval, and the across-seed gain (black), per set
    and decoding: how far one seed's claim is from another's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        (f"{split}\n{label}", result)
        for split, decodings in report["sets"].items()
        for label, result in decodings.items()
        if result["across_seeds"].get("diff") is not None
    ]
    names = list(report["runs"])
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 3.8))
    width = 0.8 / (len(names) + 1)
    series = [(name, f"C{k}", lambda r, n=name: r["runs"][n]) for k, name in enumerate(names)]
    series.append((f"across {len(names)} runs", "black", lambda r: r["across_seeds"]))
    for k, (label, color, pick) in enumerate(series):
        xs = [i + k * width for i in range(len(rows))]
        diffs = [100 * pick(r)["diff"] for _, r in rows]
        errors = [
            [d - 100 * pick(r)["ci95"][0] for d, (_, r) in zip(diffs, rows, strict=True)],
            [100 * pick(r)["ci95"][1] - d for d, (_, r) in zip(diffs, rows, strict=True)],
        ]
        marker = "D" if color == "black" else "o"
        ax.errorbar(xs, diffs, yerr=errors, fmt=marker, color=color, capsize=3, label=label)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r[0] for r in rows])
    ax.set(title="GRPO - SFT EX per run and across runs (95% paired bootstrap)")
    ax.set_ylabel("EX points")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.eval.seeds",
        description="GRPO's gain over SFT per run and across runs (seeds), per evaluation set: "
        "seeds.json, seeds.md and seeds.png in --out (docs/seeds.md).",
        epilog="e.g. python -m sqlrl.eval.seeds $(dvc exp ls --name-only) --out docs/seeds",
    )
    parser.add_argument("runs", nargs="+", help="DVC experiment names or git revisions")
    parser.add_argument("--out", required=True, help="the folder to write the report to")
    parser.add_argument("--root", default=".", help="the repository (default: here)")
    args = parser.parse_args(argv)
    try:
        report = seed_report([load_run(name, args.root) for name in args.runs])
    except SeedReportError as exc:
        print(f"error: {exc}")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "seeds.json", report)
    table = markdown(report)
    (out / "seeds.md").write_text(table, encoding="utf-8")
    plot(report, out / "seeds.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
