"""Spider release -> the prepared JSONL files every later stage reads.

Outputs (in the out_dir dvc.yaml names, data/prepared/):
- sft.jsonl: TRL conversational prompt/completion rows (+ db_id);
- grpo.jsonl: prompt, gold_sql, db_path (relative to the working directory, the repo root under
  DVC, so the files are machine-independent), db_id, question (for the reward's schema repair);
- dev.jsonl and heldout.jsonl: question, gold, db_id, db_path, db_present, prompt.
Training examples whose database file is absent are skipped and counted (their SQL cannot be
executed for the reward). Dev examples keep their row with db_present=false, so evaluation
reports them as skipped instead of losing them.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from pathlib import Path

from sqlrl.benchmarks.sets import load_set
from sqlrl.data.augment import Augmenter, name_pools
from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.data.prompts import PromptFactory, completion_message
from sqlrl.data.rows import eval_row, recorded_path
from sqlrl.data.spider import (
    Example,
    SpiderDataError,
    database_path,
    load_examples,
    load_schemas,
)
from sqlrl.jsonio import write_jsonl
from sqlrl.params import ParamsError, PrepareParams


def query_key(sql: str) -> str:
    """A gold query's identity for the held-out split: sqlglot's canonical SQLite text,
    lower-cased (so spacing, quoting and keyword case do not make two queries); the folded
    text when sqlglot cannot parse it."""
    import sqlglot
    from sqlglot.errors import SqlglotError

    folded = " ".join(sql.split()).lower()
    try:
        parsed = sqlglot.parse_one(sql, read="sqlite")
    except (SqlglotError, ValueError, RecursionError):
        return folded
    return parsed.sql(dialect="sqlite").lower() if parsed is not None else folded


def split_heldout(examples: list[Example], fraction: float, seed: int):
    """Keep `fraction` of each database's distinct gold queries out of training, with every
    question that asks for them, deterministically.

    Spider has about two paraphrased questions per query; holding out questions would leave
    most held-out answers in training (79% did). Per database: the query groups are shuffled
    by a generator seeded by (seed, db_id) and round(fraction * groups) are held out.
    Order within each output follows the input file, so outputs are stable and diffable.
    Returns (train, heldout, stats).
    """
    if fraction <= 0:
        return list(examples), [], {}
    groups: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for i, ex in enumerate(examples):
        groups[ex.db_id].setdefault(query_key(ex.query), []).append(i)
    held: set[int] = set()
    n_held_groups = 0
    for db_id, by_query in groups.items():
        keys = list(by_query)  # first-seen order: deterministic
        random.Random(f"{seed}:{db_id}").shuffle(keys)
        chosen = keys[: round(fraction * len(keys))]
        n_held_groups += len(chosen)
        held.update(i for key in chosen for i in by_query[key])
    train = [ex for i, ex in enumerate(examples) if i not in held]
    heldout = [ex for i, ex in enumerate(examples) if i in held]
    n_groups = sum(len(by_query) for by_query in groups.values())
    return (
        train,
        heldout,
        {"groups_train": n_groups - n_held_groups, "groups_heldout": n_held_groups},
    )


def split_rl_only(examples: list[Example], fraction: float, seed: int):
    """(sft, rl_only, stats): `fraction` of each database's training queries, with all their
    questions, kept out of SFT and given to GRPO alone, split like the held-out set (whole
    queries) under its own seed. Why: GRPO on the questions SFT memorised learns little that
    carries to new queries; on queries SFT never saw, its prompts look like the held-out
    ones. With fraction 0, SFT and GRPO share every training question."""
    if fraction <= 0:
        return list(examples), [], {}
    sft, rl_only, stats = split_heldout(examples, fraction, f"{seed}:rl-only")
    return sft, rl_only, {"rl_only": len(rl_only), "groups_rl_only": stats["groups_heldout"]}


def _limit(items: list, n: int) -> list:
    return items[:n] if n > 0 else items


def _length_stats(texts: list[str]) -> dict:
    if not texts:
        return {"n": 0}
    chars = sorted(len(t) for t in texts)
    return {
        "n": len(chars),
        "mean_chars": round(statistics.fmean(chars), 1),
        "p50_chars": chars[len(chars) // 2],
        "p95_chars": chars[int(0.95 * (len(chars) - 1))],
        "max_chars": chars[-1],
    }


def _token_stats(sft_rows: list[dict]) -> dict:
    """Tokens of each SFT row (prompt, assistant header, SQL, <|im_end|>) by Qwen2.5's
    tokenizer, so sft.max_length can be checked against the data before training."""
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    tokenizer = build_qwen25_tokenizer()
    lengths = sorted(
        len(
            tokenizer.apply_chat_template(
                r["prompt"] + r["completion"],
                tools=r.get("tools"),
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for r in sft_rows
    )
    if not lengths:
        return {"n": 0}
    return {
        "n": len(lengths),
        "p50": lengths[len(lengths) // 2],
        "p95": lengths[int(0.95 * (len(lengths) - 1))],
        "max": lengths[-1],
    }


def _grpo_row(ex: Example, messages: list[dict], db_path: Path) -> dict:
    """A GRPO row: the prompt and what the reward executes (the gold, on its database)."""
    return {
        "prompt": messages,
        "gold_sql": ex.query,
        "db_id": ex.db_id,
        "question": ex.question,
        "db_path": recorded_path(db_path),
    }


def prepare(
    params: PrepareParams,
    seed: int,
    spider_dir: str | Path,
    out_dir: str | Path,
    extra_dir: str | Path | None = None,
    raw_dir: str | Path | None = None,
    sft_format=None,
) -> dict:
    """Read the Spider release in `spider_dir` (and prepare.extra_train's files in
    `extra_dir`, prepare.extra_train_sets' in `raw_dir`), write the four JSONL files into
    `out_dir`, return metrics/prepare.json.
    `sft_format` (the format's SftFormatter, sqlrl/formats/): sft.jsonl in grpo.rollout's
    format; None: the query alone. Passed in by the stage, so that what imports this module
    (the evaluation sets' preparation) never builds the GRPO environment."""
    spider_dir, out_dir = Path(spider_dir), Path(out_dir)
    if not spider_dir.is_dir():
        raise SpiderDataError(
            f"{spider_dir}: Spider is not there (run `dvc pull`, or put a Spider release there)"
        )
    schemas = load_schemas(spider_dir / "tables.json")
    train_files = ["train_spider.json"] + (
        ["train_others.json"] if params.include_train_others else []
    )
    train_all = [ex for name in train_files for ex in load_examples(spider_dir / name, schemas)]
    dev = load_examples(spider_dir / "dev.json", schemas)

    present = {db_id: database_path(spider_dir, db_id).is_file() for db_id in schemas}
    train_present = [ex for ex in train_all if present[ex.db_id]]
    absent_train_dbs = sorted({ex.db_id for ex in train_all if not present[ex.db_id]})
    train, heldout, split_stats = split_heldout(train_present, params.heldout_fraction, seed)
    train = _limit(train, params.max_train_examples)
    heldout = _limit(heldout, params.max_dev_examples)
    dev = _limit(dev, params.max_dev_examples)
    extra, extra_stats = extra_training_examples(
        params.extra_train, extra_dir, schemas, present, heldout + dev
    )
    sft_train, rl_only, rl_stats = split_rl_only(train, params.rl_only_fraction, seed)
    sft_train = sft_train + extra

    prompts = PromptFactory(PromptSettings.from_prepare(params), schemas, spider_dir)
    sft_rows, grpo_rows = [], []
    sources = []  # per SFT row: its gold and database (what an agent trajectory probes)
    for ex in sft_train:
        messages = prompts.messages(ex.db_id, ex.question)
        db_path = database_path(spider_dir, ex.db_id)
        sft_rows.append(_sft_row(ex, messages))
        sources.append(_grpo_row(ex, messages, db_path))
        if not rl_only:
            grpo_rows.append(sources[-1])
    for ex in rl_only:
        messages = prompts.messages(ex.db_id, ex.question)
        grpo_rows.append(_grpo_row(ex, messages, database_path(spider_dir, ex.db_id)))
    augment_stats = augment_rows(sft_rows, sft_train, prompts, params, seed)
    sources += [None] * (len(sft_rows) - len(sources))  # the copies: no database to look at
    n_grpo = len(grpo_rows)
    sets_stats = add_training_sets(sft_rows, grpo_rows, params, raw_dir)
    sources += grpo_rows[n_grpo:]
    format_stats = sft_format.format_rows(sft_rows, sources) if sft_format else {}
    dev_rows = [eval_row(ex, database_path(spider_dir, ex.db_id), prompts) for ex in dev]
    heldout_rows = [eval_row(ex, database_path(spider_dir, ex.db_id), prompts) for ex in heldout]

    write_jsonl(out_dir / "sft.jsonl", sft_rows)
    write_jsonl(out_dir / "grpo.jsonl", grpo_rows)
    write_jsonl(out_dir / "dev.jsonl", dev_rows)
    write_jsonl(out_dir / "heldout.jsonl", heldout_rows)

    dev_absent = sum(not r["db_present"] for r in dev_rows)
    return {
        "train": {
            "examples": len(train_all),
            "skipped_db_absent": len(train_all) - len(train_present),
            "absent_databases": absent_train_dbs,
            "sft": len(sft_rows),
            "grpo": len(grpo_rows),
            "heldout": len(heldout_rows),
            "heldout_split": "query",
            **split_stats,
            **rl_stats,
        },
        "dev": {
            "examples": len(dev_rows),
            "skipped_db_absent": dev_absent,
            "absent_databases": sorted({r["db_id"] for r in dev_rows if not r["db_present"]}),
        },
        "prompt_length": {
            "train": _length_stats([m[1]["content"] for m in (r["prompt"] for r in sft_rows)]),
            "dev": _length_stats([r["prompt"][1]["content"] for r in dev_rows if r["prompt"]]),
        },
        "schema_format": params.schema_format,
        "sample_rows_reduced": dict(sorted(prompts.sample_rows_used.items())),
        **({"sft_tokens": _token_stats(sft_rows)} if params.max_prompt_tokens else {}),
        "augment": augment_stats,
        **({"extra_train": extra_stats} if params.extra_train else {}),
        **({"extra_train_sets": sets_stats} if params.extra_train_sets else {}),
        **({"sft_format": format_stats} if format_stats else {}),
    }


def _sft_row(ex: Example, messages: list[dict]) -> dict:
    """An SFT row: the prompt, and the gold SQL as the answer."""
    return {"prompt": messages, "completion": completion_message(ex.query), "db_id": ex.db_id}


def add_training_sets(
    sft_rows: list[dict], grpo_rows: list[dict], params: PrepareParams, raw_dir
) -> dict:
    """Append the SFT and GRPO rows of prepare.extra_train_sets (BIRD's train split, say):
    each set read as an evaluation set is (sqlrl/benchmarks/sets.py), its questions asked
    with their evidence, under the same prompt settings; questions whose database is absent
    are skipped and counted. Returns the counts per set."""
    if not params.extra_train_sets:
        return {}
    if raw_dir is None:
        raise ValueError("prepare.extra_train_sets names sets, but no folder (--raw) holds them")
    settings = PromptSettings.from_prepare(params)
    stats = {}
    for name, spec in params.extra_train_sets.items():
        examples, schemas, databases = load_set(name, spec, raw_dir, "prepare.extra_train_sets")
        prompts = PromptFactory(settings, schemas, None, locate=databases.path)
        kept = [ex for ex in examples if databases.path(ex.db_id).is_file()]
        for ex in kept:
            messages = prompts.messages(ex.db_id, ex.question, ex.evidence)
            sft_rows.append(_sft_row(ex, messages))
            grpo_rows.append(_grpo_row(ex, messages, databases.path(ex.db_id)))
        stats[name] = {
            "format": spec.format,
            "examples": len(examples),
            "kept": len(kept),
            "skipped_db_absent": len(examples) - len(kept),
            "absent_databases": sorted(
                {ex.db_id for ex in examples if not databases.path(ex.db_id).is_file()}
            ),
        }
    return stats


def extra_training_examples(
    names: list[str],
    folder: str | Path | None,
    schemas: dict,
    present: dict[str, bool],
    evaluated: list[Example],
) -> tuple[list[Example], dict]:
    """The examples of prepare.extra_train's Spider-format files (e.g. exported feedback),
    less those the pipeline could not train on or that would leak into a measure: a database
    that is absent, or a gold query that a dev or held-out question asks for (compared as
    query_key does). Returns (examples, counts per file)."""
    if not names:
        return [], {}
    if folder is None:
        raise ValueError("prepare.extra_train names files, but no folder holds them")
    measured = {query_key(ex.query) for ex in evaluated}
    kept, stats = [], {}
    for name in names:
        path = Path(folder) / name
        if not path.is_file():
            raise SpiderDataError(f"prepare.extra_train: {path}: no such file")
        examples = load_examples(path, schemas)
        usable = [ex for ex in examples if present[ex.db_id]]
        fresh = [ex for ex in usable if query_key(ex.query) not in measured]
        kept += fresh
        stats[name] = {
            "examples": len(examples),
            "kept": len(fresh),
            "skipped_db_absent": len(examples) - len(usable),
            "skipped_evaluated_query": len(usable) - len(fresh),
        }
    return kept, stats


def augment_rows(
    sft_rows: list[dict],
    train: list[Example],
    prompts: PromptFactory,
    params: PrepareParams,
    seed: int,
) -> dict:
    """Append `params.augment.copies` schema-grounding copies of each training example (a
    fractional part copies a seeded sample of the examples)."""
    aug = params.augment
    if aug.copies == 0 or not (aug.shuffle_schema or aug.rename_prob > 0):
        return {"copies": 0}
    if params.sample_rows > 0:
        raise ParamsError(
            "prepare.augment needs prepare.sample_rows: 0 (sample rows are read "
            "from the real database, under the real names)"
        )
    schemas = prompts.schemas
    augmenter = Augmenter(
        aug.shuffle_schema, aug.rename_prob, name_pools(schemas[ex.db_id] for ex in train), seed
    )
    for copy, indices in enumerate(_copy_rounds(len(train), aug.copies, seed)):
        for i in indices:
            ex = train[i]
            schema, question, sql = augmenter.augment(
                schemas[ex.db_id], ex.question, ex.query, f"{i}:{copy}"
            )
            messages = prompts.messages_for_schema(schema, question)  # no database: no rows
            sft_rows.append(
                {"prompt": messages, "completion": completion_message(sql), "db_id": ex.db_id}
            )
    return {"copies": aug.copies, **augmenter.stats.as_dict()}


def _copy_rounds(n: int, copies: float, seed: int) -> list[list[int]]:
    """Example indices per round of copies: all of them in each whole round, then a seeded
    sample of round(fraction * n) in original order (so 0.5 keeps originals at 2/3 of the data)."""
    whole = int(copies)
    rounds = [list(range(n)) for _ in range(whole)]
    part = round((copies - whole) * n)
    if part:
        rounds.append(sorted(random.Random(f"{seed}:augment-sample").sample(range(n), part)))
    return rounds
