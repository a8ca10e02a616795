"""Seconds per GRPO step and per evaluated question in each rollout format (grpo.rollout: sql,
reasoning, agent), on the same prompts and settings, through the stage's own train_grpo and the
evaluate stage's evaluate_model.

    python benchmarks/bench_grpo_rollouts.py [--model models/sft | --model sql=DIR
        --model reasoning=DIR --model agent=DIR] [--profile smoke] [--steps 2]
        [--max-completion-length 128] [--rollouts sql reasoning agent] [--eval-questions 24]
        [-S grpo.num_generations=4 ...]

The prompts are the profile's: Spider prepared as the prepare stage does (into a scratch
folder; data/prepared is left alone), its first grpo.prompts_per_step x steps GRPO rows and its
first --eval-questions dev questions (0: no evaluation). The model is --model: one SFT model
folder for every format, or one per format (`sql=DIR`: each format on a model SFT-trained in
it, which is what a user's run costs); without it, a random Qwen2 of the profile's
architecture on Qwen2.5's real tokenizer. The chat template must be able to call tools for the
agent: Qwen2.5's, or a `base.tokenizer: trained-tools` model's (the smoke-agent profile).
Each format runs with its own prompt (the agent's carries the tool's schema), the `format`
reward weighted in for reasoning (0.1), the same max_completion_length for all; the table
shows metrics/grpo.json's seconds_per_step split (generation, reward, update), the mean
completion length, the agent's tool calls, and greedy evaluation's seconds per question (an
agent's question is every turn of its episode, each of up to eval.max_new_tokens).

What it measures depends on the model: a random model writes neither tags nor tool calls, so
it only shows the formats' fixed costs (the longer agent prompt, the same token budget); a
model SFT-trained in a format (grpo.rollout at prepare) shows the cost of its tool turns.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from contextlib import chdir
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlrl.jsonio import read_jsonl  # noqa: E402
from sqlrl.params import compose_params, params_from_dict  # noqa: E402


def grpo_rows(params, n: int) -> tuple[list[dict], Path]:
    """The profile's first n GRPO rows, prepared in a scratch root that links the pulled Spider
    (so db_path is data/raw/spider/..., as under DVC); returns them with that root."""
    from sqlrl.data.prepare import prepare

    root = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    (root / "data/raw").mkdir(parents=True)
    (root / "data/raw/spider").symlink_to(REPO / "data/raw/spider", target_is_directory=True)
    with chdir(root):
        prepare(params.prepare, params.seed, "data/raw/spider", "data/prepared")
    rows = read_jsonl(root / "data/prepared/grpo.jsonl", ("prompt", "gold_sql", "db_path"))
    return rows[:n], root


def eval_seconds_per_question(params, model: Path, root: Path, n: int) -> float | None:
    """Greedy evaluation of the first n dev questions, in the format the model records (what
    evaluate@<model> runs): generation seconds per question."""
    if n <= 0:
        return None
    from sqlrl.eval.evaluate import evaluate_model

    dev = root / "data/prepared/dev.jsonl"
    subset = root / f"dev-{n}.jsonl"
    subset.write_text("".join(dev.read_text().splitlines(keepends=True)[:n]))
    with chdir(root):
        metrics, _ = evaluate_model(
            model,
            params.eval,
            params.seed,
            {"dev": subset},  # a Spider split: scored against data/raw/spider's tables
            spider_dir="data/raw/spider",
            progress=False,
        )
    return metrics["dev"]["generation_seconds"] / n


def random_model(params, folder: Path) -> Path:
    """A random Qwen2 of the profile's architecture on Qwen2.5's tokenizer (tool template)."""
    from sqlrl.model.modeling import build_scratch_model
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    tokenizer = build_qwen25_tokenizer()
    build_scratch_model(params.base.architecture, tokenizer, seed=params.seed).save_pretrained(
        folder
    )
    tokenizer.save_pretrained(folder)
    return folder


def run(params, model: Path, rows: list[dict], root: Path, rollout: str) -> dict:
    from sqlrl.train.grpo import train_grpo
    from sqlrl.train.rewards import reward_functions

    grpo = dataclasses.replace(params.grpo, rollout=rollout, save_steps=10**6)
    if rollout == "reasoning":
        grpo = dataclasses.replace(grpo, reward_weights={**grpo.reward_weights, "format": 0.1})
    with chdir(root):
        return train_grpo(
            grpo,
            params.seed,
            model,
            rows,
            root / f"adapter-{rollout}",
            reward_functions(grpo, "data/raw/spider"),
            checkpoint_dir=root / f"checkpoints-{rollout}",
            dvclive_dir=None,
            torch_threads=params.torch_threads,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="an SFT model folder for every format, or ROLLOUT=DIR (default: a random Qwen2)",
    )
    parser.add_argument("--eval-questions", type=int, default=24)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-completion-length", type=int, default=128)
    parser.add_argument("--rollouts", nargs="+", default=["sql", "reasoning", "agent"])
    parser.add_argument("-S", dest="overrides", action="append", default=[], help="KEY=VALUE")
    args = parser.parse_args()
    overrides = [
        "base.tokenizer=qwen2.5",
        f"grpo.steps={args.steps}",
        f"grpo.max_completion_length={args.max_completion_length}",
        *args.overrides,
    ]
    params = params_from_dict(compose_params(args.profile, overrides, conf_dir=REPO / "conf"))
    rows, root = grpo_rows(params, params.grpo.prompts_per_step * args.steps)
    models = format_models(args.model, args.rollouts, params, root)
    print(
        f"profile {args.profile}, models {args.model or 'random Qwen2 (Qwen2.5 tokenizer)'}, "
        f"{args.steps} steps of {params.grpo.prompts_per_step} questions x "
        f"{params.grpo.num_generations} completions, max_completion_length "
        f"{args.max_completion_length}"
    )
    results = {r: run(params, models[r], rows, root, r) for r in args.rollouts}
    per_question = {
        r: eval_seconds_per_question(params, models[r], root, args.eval_questions)
        for r in args.rollouts
    }
    print(
        f"{'rollout':<10} {'s/step':>8} {'generation':>11} {'reward':>8} {'update':>8} "
        f"{'tokens':>7} {'tool calls':>11} {'eval s/question':>16}"
    )
    for rollout, metrics in results.items():
        split = metrics["seconds_per_step"]
        calls = metrics.get("tool_calls_per_episode")
        seconds = per_question[rollout]
        print(
            f"{rollout:<10} {split['total']:>8.2f} {split['generation']:>11.2f} "
            f"{split['reward']:>8.2f} {split['update']:>8.2f} "
            f"{metrics['mean_completion_length'] or 0:>7.1f} "
            f"{'' if calls is None else calls:>11} {'' if seconds is None else round(seconds, 3):>16}"
        )


def format_models(given: list[str], rollouts: list[str], params, root: Path) -> dict[str, Path]:
    """Each format's model: `ROLLOUT=DIR` entries, one folder for all, or a random model."""
    if not given:
        model = random_model(params, root / "model")
        return dict.fromkeys(rollouts, model)
    if len(given) == 1 and "=" not in given[0]:
        return dict.fromkeys(rollouts, Path(given[0]).resolve())
    pairs = dict(entry.split("=", 1) for entry in given if "=" in entry)
    missing = [r for r in rollouts if r not in pairs]
    if missing or len(pairs) < len(given):
        raise SystemExit(f"--model: give ROLLOUT=DIR for each of {rollouts} (missing {missing})")
    return {r: Path(pairs[r]).resolve() for r in rollouts}


if __name__ == "__main__":
    main()
