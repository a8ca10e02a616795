"""The rows the rehearsal trains on: chosen on the CPU by the bundle (the longest SFT rows in
Qwen2.5 tokens, a seeded random sample of them, GRPO prompts half long and half ordinary with a
usable gold result, and their SQLite files), and read back on the GPU side (grpo_rows, with the
bundle's database paths made absolute)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from sqlrl.jsonio import read_jsonl


def chat_text(row: dict, generation_prompt: bool) -> str:
    """The text the trainer tokenizes: the SFT row (prompt + SQL), or the GRPO prompt with
    the assistant header."""
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    messages = row["prompt"] if generation_prompt else row["prompt"] + row["completion"]
    return build_qwen25_tokenizer().apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def token_lengths(rows: list[dict], generation_prompt: bool) -> list[int]:
    """Qwen2.5 tokens of each row as the trainer sees it (one batch call: the same ids as
    apply_chat_template(tokenize=True), encoded in parallel)."""
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    texts = [chat_text(r, generation_prompt) for r in rows]
    return [
        len(ids) for ids in build_qwen25_tokenizer()(texts, add_special_tokens=False)["input_ids"]
    ]


def longest(rows: list[dict], n: int, generation_prompt: bool) -> list[tuple[int, dict]]:
    """The n longest rows in tokens, longest first, as (tokens, row). Every row is tokenized:
    characters are a poor proxy (sample rows full of digits cost a token per digit)."""
    lengths = token_lengths(rows, generation_prompt)
    return sorted(zip(lengths, rows, strict=False), key=lambda x: -x[0])[:n]


def random_rows(rows: list[dict], n: int, seed: int) -> list[dict]:
    """n rows drawn without replacement, seeded: what SFT steps meet in the real run, lengths
    and padding included (the longest rows alone show the memory peak, not the speed)."""
    return random.Random(seed).sample(rows, min(n, len(rows)))


def grpo_selection(rows: list[dict], n: int, seed: int) -> list[dict]:
    """n GRPO prompts: half the longest, half drawn at random from the rest, each with a gold
    result the grpo_prompts stage would keep (sqlrl.train.grpo_prompts.drop_empty_gold)."""
    from sqlrl.sql.executor import SQLExecutor
    from sqlrl.train.grpo_prompts import SelectionStats, drop_empty_gold

    executor, stats = SQLExecutor(), SelectionStats()
    candidates = [row for _, row in longest(rows, 4 * n, generation_prompt=True)]
    long_rows = drop_empty_gold(candidates, executor, stats)[: n // 2]
    rest = [r for r in rows if not any(r is x for x in long_rows)]
    random.Random(seed).shuffle(rest)
    ordinary = drop_empty_gold(rest[: 4 * n], executor, stats)[: n - len(long_rows)]
    picked = long_rows + ordinary
    if len(picked) < n:
        raise ValueError(f"only {len(picked)} GRPO prompts with a usable gold result, asked {n}")
    return picked


def copy_databases(rows: list[dict], scratch_root: Path, bundle: Path) -> dict[str, float]:
    """Each GRPO row's SQLite file into bundle/database/<db_id>/; the row's db_path becomes
    relative to the bundle (the run makes it absolute wherever the bundle lands)."""
    sizes = {}
    for row in rows:
        source = scratch_root / row["db_path"]
        target = Path("database") / row["db_id"] / source.name
        if row["db_id"] not in sizes:
            (bundle / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, bundle / target)
            sizes[row["db_id"]] = round(source.stat().st_size / 2**20, 2)
        row["db_path"] = target.as_posix()
    return sizes


def grpo_rows(bundle: Path, tiny: bool, prompts_per_step: int) -> list[dict]:
    """The bundle's GRPO rows with absolute database paths; with tiny, one step's worth of the
    shortest prompts (see TINY_GRPO)."""
    from sqlrl.train.grpo_prompts import ROW_KEYS

    rows = read_jsonl(bundle / "grpo.jsonl", ROW_KEYS)
    for row in rows:
        row["db_path"] = str((bundle / row["db_path"]).resolve())
    if tiny:  # TRL pads a step to its longest prompt: the shortest in tokens, not characters
        lengths = token_lengths(rows, generation_prompt=True)
        rows = [row for _, row in sorted(zip(lengths, rows, strict=True), key=lambda x: x[0])]
        rows = rows[:prompts_per_step]
    return rows
