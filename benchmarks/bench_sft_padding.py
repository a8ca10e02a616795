"""The share of an SFT batch that is padding, for a profile's real prepared rows, with and
without grouping rows by length (sft.group_by_length).

    python benchmarks/bench_sft_padding.py [--profile qwen2.5-coder-3b] [--epochs 3]

Prepares Spider as the prepare stage does for the profile (into a scratch folder; data/prepared
is left alone), measures every SFT row in the profile's tokens (Qwen2.5's real tokenizer for a
hub or qwen2.5 profile) through the chat template as the trainer sees it, and batches the rows
as transformers' Trainer does for each strategy: a random permutation, or its
LengthGroupedSampler over sft.batch_size x accumulation rows, cut into per-process batches of
the profile's size. A batch costs its longest row times its rows; what is not a real token is
padding. metrics/sft.json reports the same counts for the rows a run really trained on.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import chdir
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlrl.jsonio import read_jsonl  # noqa: E402
from sqlrl.params import compose_params, params_from_dict  # noqa: E402


def prepared_rows(params) -> list[dict]:
    """The profile's SFT rows, prepared in a scratch root that links the pulled Spider."""
    from sqlrl.data.prepare import prepare

    root = Path(tempfile.mkdtemp(prefix="padding-prepare-"))
    (root / "data/raw").mkdir(parents=True)
    (root / "data/raw/spider").symlink_to(REPO / "data/raw/spider", target_is_directory=True)
    with chdir(root):
        prepare(params.prepare, params.seed, "data/raw/spider", "data/prepared")
    return read_jsonl(root / "data/prepared/sft.jsonl", ("prompt", "completion"))


def row_tokens(rows: list[dict], params) -> list[int]:
    """Tokens of each row (prompt + completion in the chat template)."""
    if params.base.source == "hub" or params.base.tokenizer == "qwen2.5":
        from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

        tokenizer = build_qwen25_tokenizer()
    else:
        raise SystemExit(
            "a scratch profile's tokenizer is trained by the base stage: use its model"
        )
    texts = [
        tokenizer.apply_chat_template(r["prompt"] + r["completion"], tokenize=False) for r in rows
    ]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def padding(lengths: list[int], order: list[int], batch_size: int) -> tuple[int, int]:
    """(real tokens, padding tokens) of the batches `order` is cut into."""
    real = pad = 0
    for start in range(0, len(order), batch_size):
        batch = [lengths[i] for i in order[start : start + batch_size]]
        real += sum(batch)
        pad += max(batch) * len(batch) - sum(batch)
    return real, pad


def orders(lengths: list[int], grouped: bool, step_rows: int, seed: int) -> list[int]:
    """One epoch's row order as the Trainer's sampler draws it."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    generator = torch.Generator().manual_seed(seed)
    if grouped:
        return list(LengthGroupedSampler(step_rows, lengths=lengths, generator=generator))
    return torch.randperm(len(lengths), generator=generator).tolist()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="qwen2.5-coder-3b")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    params = params_from_dict(compose_params(args.profile))
    batch, accumulation = params.sft.per_process(1)
    lengths = row_tokens(prepared_rows(params), params)
    ordered = sorted(lengths)
    print(
        f"{args.profile}: {len(lengths)} SFT rows, tokens median {ordered[len(ordered) // 2]}, "
        f"p95 {ordered[int(0.95 * len(ordered))]}, max {ordered[-1]}; batches of {batch} rows"
    )
    for grouped in (False, True):
        real = pad = 0
        for epoch in range(args.epochs):
            r, p = padding(lengths, orders(lengths, grouped, batch * accumulation, epoch), batch)
            real, pad = real + r, pad + p
        print(
            f"  group_by_length={grouped}: {real} tokens trained, {pad} padding "
            f"({pad / (real + pad):.1%} of the batches)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
