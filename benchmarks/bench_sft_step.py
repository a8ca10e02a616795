"""SFT training speed (tokens/s) of a profile's own base model on its own prepared rows, for a
few steps, with the SFT params overridden as a run would be: what a setting such as
sft.prompt_loss_sample saves in the stage that dominates the CPU default's DAG.

    python benchmarks/bench_sft_step.py [--rows 800] [-S sft.prompt_loss_sample=0.1]
    farm-bench -n 3 --timeout 900 -- python benchmarks/bench_sft_step.py -S ... \\
        --vs "python benchmarks/bench_sft_step.py"

Reads models/base and data/prepared/sft.jsonl (run `dvc repro base` first), trains on the
first --rows rows (one epoch, the profile's batch and length grouping) into a scratch folder,
and prints one line: tokens trained, the trainer's wall seconds and tokens/s (metrics/sft.json's
measure). Nothing in the repository is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlrl.params import compose_params, params_from_dict  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--rows", type=int, default=800, help="first rows of sft.jsonl trained")
    parser.add_argument("-S", dest="overrides", action="append", default=[], help="key=value")
    args = parser.parse_args()

    from sqlrl.train.sft import train_sft

    params = params_from_dict(compose_params(args.profile, args.overrides, REPO / "conf"))
    sft = dataclasses.replace(params.sft, epochs=1.0, save_steps=0, resume=False)
    with tempfile.TemporaryDirectory(prefix="bench-sft-") as scratch:
        rows = Path(scratch) / "sft.jsonl"
        with open(REPO / "data/prepared/sft.jsonl") as source:
            rows.write_text("".join(itertools.islice(source, args.rows)))
        metrics = train_sft(
            sft,
            params.seed,
            REPO / "models/base",
            rows,
            Path(scratch) / "sft",
            dvclive_dir=None,
            torch_threads=params.torch_threads,
        )
    print(
        f"{' '.join(args.overrides) or 'profile'}: {metrics['train_tokens']} tokens "
        f"in {metrics['wall_seconds']} s = {metrics['tokens_per_second']} tokens/s "
        f"(steps {metrics['steps']}, final loss {metrics['final_loss']:.4g})"
    )


if __name__ == "__main__":
    main()
