"""DVC stage `evaluate@<name>`: models/<name> on the dev (and held-out) split ->
metrics/eval_<name>.json, data/predictions/<name>.jsonl and data/predictions/<name>_heldout.jsonl.

    python -m stages.evaluate sft [--baseline base]

With --baseline, metrics/eval_<name>.json also gets `vs_<baseline>`: the paired bootstrap 95%
interval of the EX difference against that model's predictions, per split.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from sqlrl.eval.compare import compare_predictions  # noqa: E402
from sqlrl.eval.evaluate import evaluate_model  # noqa: E402
from sqlrl.hardware import set_torch_threads  # noqa: E402
from sqlrl.jsonio import (  # noqa: E402
    read_jsonl,
    write_json,  # noqa: E402
    write_jsonl,
)
from sqlrl.params import load_params  # noqa: E402
from sqlrl.paths import REPO_ROOT  # noqa: E402
from stages import run_stage  # noqa: E402

SPLITS = {"dev": "data/prepared/dev.jsonl", "heldout": "data/prepared/heldout.jsonl"}


def main(argv: list[str], root: Path = REPO_ROOT) -> int:
    """Evaluate models/<argv[0]> under `root` (the repo root; tests pass a copy)."""
    baseline = None
    if len(argv) == 3 and argv[1] == "--baseline":
        argv, baseline = argv[:1], argv[2]
    if len(argv) != 1 or not argv[0] or "/" in argv[0] or "/" in (baseline or ""):
        print(
            "usage: python -m stages.evaluate NAME [--baseline OTHER]   (evaluates "
            "models/NAME, compared with OTHER's predictions)",
            file=sys.stderr,
        )
        return 2
    name, root = argv[0], Path(root)
    model_dir = root / "models" / name
    if not model_dir.is_dir():
        print(
            f"evaluate: {model_dir} does not exist (run `dvc repro {name}` first)", file=sys.stderr
        )
        return 1
    try:
        params = load_params(root / "params.yaml")
        set_torch_threads(params.torch_threads)
        splits = {split: root / path for split, path in SPLITS.items()}
        metrics, predictions = evaluate_model(model_dir, params.eval, params.seed, splits)
    except FileNotFoundError as exc:  # the others are PipelineErrors: run_stage reports them
        print(f"evaluate: {exc}", file=sys.stderr)
        return 1
    out = root / "data" / "predictions"
    if baseline:
        try:
            metrics[f"vs_{baseline}"] = _compare(out, baseline, predictions, params.seed)
        except (FileNotFoundError, ValueError) as exc:
            print(f"evaluate: comparison with {baseline}: {exc}", file=sys.stderr)
            return 1
    write_jsonl(out / f"{name}.jsonl", predictions["dev"])
    write_jsonl(out / f"{name}_heldout.jsonl", predictions.get("heldout", []))
    write_json(root / "metrics" / f"eval_{name}.json", metrics)
    line = (
        f"evaluate@{name}: dev EX {_pct(metrics['ex'])} (non-trivial gold "
        f"{_pct(metrics['ex_nontrivial'])}) EM {_pct(metrics['em'])} "
        f"on {metrics['n']} ({metrics['skipped']} skipped; EX with skipped as wrong "
        f"{_pct(metrics['ex_all'])} of {metrics['n'] + metrics['skipped']}), "
        f"{metrics['examples_per_second']} examples/s"
    )
    if "heldout" in metrics:
        held = metrics["heldout"]
        line += (
            f"; held-out EX {_pct(held['ex'])} (non-trivial gold "
            f"{_pct(held['ex_nontrivial'])}) EM {_pct(held['em'])} on {held['n']}"
        )
    print(line)
    return 0


def _compare(pred_dir: Path, baseline: str, predictions: dict, seed: int) -> dict:
    """Paired bootstrap of EX against the baseline's prediction files, per split."""
    out = {}
    for split, suffix in (("dev", ""), ("heldout", "_heldout")):
        path = pred_dir / f"{baseline}{suffix}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing (run `dvc repro evaluate@{baseline}`)")
        if predictions.get(split):
            out[split] = compare_predictions(read_jsonl(path), predictions[split], seed)
    return out


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


if __name__ == "__main__":
    _model = sys.argv[1] if len(sys.argv) > 1 else "model"
    sys.exit(run_stage(f"evaluate-{_model}", main, sys.argv[1:]))
