"""Helpers for tests that drive git and DVC in a temporary copy of the repo."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SPIDER_DIR = REPO_ROOT / "data" / "raw" / "spider"  # from `dvc pull`
# The profile the unit tests compose their params from, never the workspace params.yaml: a
# change of the default profile must not change a unit test. A test whose assertion depends on
# a value sets that value itself (an override, or dataclasses.replace).
TEST_PROFILE = "smoke"


@functools.cache
def _composed(overrides: tuple[str, ...]) -> dict:
    from sqlrl.params import compose_params

    return compose_params(TEST_PROFILE, list(overrides), conf_dir=REPO_ROOT / "conf")


def tiny_arch():
    """A Qwen2 of hidden size 32 and 2 layers, small enough to build and run in a test."""
    from sqlrl.params import ArchitectureParams

    return ArchitectureParams(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        vocab_size=400,
    )


def fixed_params_dict(*overrides: str) -> dict:
    """params.yaml's content for TEST_PROFILE with Hydra overrides such as
    `eval.max_new_tokens=6` (a fresh copy: the caller may change it)."""
    return copy.deepcopy(_composed(overrides))


def fixed_params(*overrides: str):
    """`Params` for TEST_PROFILE with overrides (see fixed_params_dict)."""
    from sqlrl.params import params_from_dict

    return params_from_dict(fixed_params_dict(*overrides))


def eval_params(**changes):
    """The test profile's eval section, greedy on transformers, no repair, no extra sets."""
    import dataclasses

    fixed = dict(max_new_tokens=16, use_vllm=False, num_samples=1, schema_repair=False)
    return dataclasses.replace(fixed_params().eval, sets={}, vote_models=[], **{**fixed, **changes})


def write_fixed_params(path: Path, *overrides: str) -> Path:
    """A params.yaml at `path` for a stage's --params: TEST_PROFILE with overrides."""
    import yaml

    path.write_text(yaml.safe_dump(fixed_params_dict(*overrides), sort_keys=False))
    return path


def run_cli(args: list[str], cwd: Path, env: dict | None = None) -> str:
    """Run a command (dvc, git) with the venv on PATH; a failure shows its output."""
    env = {
        **os.environ,
        **(env or {}),
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout + proc.stderr


def is_git_checkout(root: Path = REPO_ROOT) -> bool:
    """Whether `root` is the top of a git checkout with a commit (not an unpacked archive,
    nor a folder inside some other repository)."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True
        )
        head = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=root, capture_output=True
        )
    except OSError:  # no git here
        return False
    return (
        top.returncode == 0
        and head.returncode == 0
        and Path(top.stdout.strip()).resolve() == Path(root).resolve()
    )


def committed_text(path: str, root: Path = REPO_ROOT) -> str:
    """The text of `path` (relative to `root`) as HEAD holds it: the committed version, whatever
    a local `dvc repro` has since written to the working tree. Outside a git checkout there is
    no committed version, and the working tree's file is read instead."""
    if not is_git_checkout(root):
        return (Path(root) / path).read_text(encoding="utf-8")
    done = subprocess.run(
        ["git", "show", f"HEAD:./{path}"], cwd=root, capture_output=True, encoding="utf-8"
    )
    if done.returncode != 0:
        raise AssertionError(f"git show HEAD:./{path} failed: {done.stderr.strip()}")
    return done.stdout


def committed_out_md5(out: str, root: Path = REPO_ROOT) -> str | None:
    """The md5 that the committed dvc.lock records for output `out` of the stage producing it
    (a directory's ends in `.dir`), or None when no stage there has that output."""
    import yaml

    lock = yaml.safe_load(committed_text("dvc.lock", root)) or {}
    for stage in (lock.get("stages") or {}).values():
        for entry in stage.get("outs") or []:
            if entry.get("path") == out:
                return entry.get("md5")
    return None


def workspace_out_md5(out: str, root: Path = REPO_ROOT) -> str | None:
    """The md5 DVC computes for output `out` as the working tree holds it, by the output's own
    hashing (`dvc status` compares this with dvc.lock): for a directory, the md5 of its file
    listing, ending in `.dir`. None when the output is absent."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        found = [o for o in repo.index.outs if o.def_path == out]
        if not found:
            raise LookupError(f"no stage in {root}/dvc.yaml has the output {out}")
        return found[0].get_hash().value if found[0].exists else None


def storage_url() -> str:
    """The shared remote as an absolute path (DVC resolves its URL relative to .dvc/)."""
    from dvc.repo import Repo

    with Repo(str(REPO_ROOT)) as repo:
        return repo.config["remote"]["storage"]["url"]


def whole_spider_prepare_params(**changes):
    """Prepare params on every example: a compact schema, 10% held out, no schema mentions,
    no sample rows and no schema-grounding augmentation unless a caller asks for them."""
    import dataclasses

    base = fixed_params().prepare
    defaults = dict(
        schema_format="compact",
        sample_rows=0,
        include_train_others=False,
        heldout_fraction=0.1,
        max_train_examples=0,
        max_dev_examples=0,
        augment=dataclasses.replace(base.augment, copies=0),
        mark_schema_mentions=False,
        max_prompt_tokens=0,
    )
    return dataclasses.replace(base, **{**defaults, **changes})


def grpo_rows(spider_dir: Path, examples) -> list[dict]:
    """GRPO rows (prompt, gold_sql, db_id, question, db_path) for Spider `examples`, as prepare
    writes them (a short system prompt: the rows' prompts stay small)."""
    from sqlrl.data.prompts import build_messages, compact_schema
    from sqlrl.data.rows import recorded_path
    from sqlrl.data.spider import database_path, load_schemas

    schemas = load_schemas(spider_dir / "tables.json")
    return [
        {
            "prompt": build_messages(compact_schema(schemas[e.db_id]), e.question, "SQL only."),
            "gold_sql": e.query,
            "db_id": e.db_id,
            "question": e.question,
            "db_path": recorded_path(database_path(spider_dir, e.db_id)),
        }
        for e in examples
    ]


def department_rows(spider_dir: Path, n: int = 4) -> list[dict]:
    """The first `n` department_management training questions as prepare writes GRPO rows
    (the agent tests' probe, `SELECT count(*) FROM head`, answers 10 there)."""
    from sqlrl.data.spider import load_examples, load_schemas

    schemas = load_schemas(spider_dir / "tables.json")
    examples = load_examples(spider_dir / "train_spider.json", schemas)
    return grpo_rows(spider_dir, [e for e in examples if e.db_id == "department_management"][:n])


def save_tiny_qwen(path: Path, head_dim: int = 8) -> Path:
    """A tiny random Qwen2 on Qwen2.5's real tokenizer and chat template (the one with tool
    calls) saved in `path`: for tests of the agent format, where the template and the tokens
    must be real and the weights need not be. vLLM's CPU attention takes head_dim 32 or more."""
    from sqlrl.model.modeling import build_scratch_model
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer
    from sqlrl.params import ArchitectureParams

    architecture = ArchitectureParams(
        hidden_size=4 * head_dim,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        vocab_size=1,  # unused: the vocabulary is the tokenizer's (qwen2_config)
    )
    tokenizer = build_qwen25_tokenizer()
    build_scratch_model(architecture, tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tables_entry(db_id: str, table: str, columns: list[str]) -> dict:
    """A tables.json entry for one table of text columns (BIRD's tables file has Spider's
    shape)."""
    return {
        "db_id": db_id,
        "table_names_original": [table],
        "table_names": [table],
        "column_names_original": [[-1, "*"]] + [[0, c] for c in columns],
        "column_names": [[-1, "*"]] + [[0, c] for c in columns],
        "column_types": ["text"] * (len(columns) + 1),
        "primary_keys": [],
        "foreign_keys": [],
    }
