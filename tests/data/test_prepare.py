"""The prepare stage on a small Spider-layout fixture cut from the real release."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil

import pytest

from sqlrl.data.prepare import prepare, split_heldout
from sqlrl.data.prompts import normalize_sql_whitespace
from sqlrl.data.spider import Example, SpiderDataError
from tests.data.conftest import DBS
from tests.repo_tools import fixed_params, whole_spider_prepare_params


def _params(**changes):
    return whole_spider_prepare_params(**changes)


def _prepare(root, params, seed):
    """The prepare stage as DVC runs it: from the repo root, with the paths dvc.yaml passes."""
    with contextlib.chdir(root):
        return prepare(params, seed, "data/raw/spider", "data/prepared")


def _read(root, name):
    with open(root / "data" / "prepared" / name, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_prepare_writes_all_splits_and_counts_absent_databases(mini_root):
    metrics = _prepare(mini_root, _params(heldout_fraction=0.1), seed=42)
    sft, grpo = _read(mini_root, "sft.jsonl"), _read(mini_root, "grpo.jsonl")
    dev, heldout = _read(mini_root, "dev.jsonl"), _read(mini_root, "heldout.jsonl")
    assert len(sft) == len(grpo) == metrics["train"]["sft"] > 0
    assert metrics["train"]["sft"] + metrics["train"]["heldout"] == metrics["train"]["examples"]
    # wta_1 is a dev database: its 62 questions stay in dev.jsonl, flagged, without a prompt
    absent = [r for r in dev if not r["db_present"]]
    assert len(absent) == metrics["dev"]["skipped_db_absent"] == 62
    assert all(r["db_id"] == "wta_1" and r["prompt"] is None for r in absent)
    assert metrics["dev"]["absent_databases"] == ["wta_1"]
    # rows carry what later stages need, with repo-relative database paths
    assert sft[0]["completion"][0]["role"] == "assistant"
    assert (
        grpo[0]["db_path"]
        == f"data/raw/spider/database/{grpo[0]['db_id']}/{grpo[0]['db_id']}.sqlite"
    )
    assert (mini_root / grpo[0]["db_path"]).is_file()
    assert grpo[0]["question"] in sft[0]["prompt"][-1]["content"]  # for the reward's repair
    assert {r["question"] for r in heldout}.isdisjoint({r["prompt"][1]["content"] for r in sft})
    assert metrics["prompt_length"]["train"]["n"] == len(sft)


def test_train_examples_of_absent_databases_are_counted_not_dropped_silently(mini_root):
    spider = mini_root / "data" / "raw" / "spider"
    shutil.rmtree(spider / "database" / "farm")
    metrics = _prepare(mini_root, _params(heldout_fraction=0.0), seed=1)
    n_farm = sum(
        e["db_id"] == "farm" for e in json.loads((spider / "train_spider.json").read_text())
    )
    assert metrics["train"]["skipped_db_absent"] == n_farm > 0
    assert metrics["train"]["absent_databases"] == ["farm"]
    assert all(r["db_id"] != "farm" for r in _read(mini_root, "grpo.jsonl"))


def test_prepare_is_deterministic_and_seed_changes_the_heldout_split(mini_root):
    _prepare(mini_root, _params(), seed=7)
    first = _read(mini_root, "heldout.jsonl")
    _prepare(mini_root, _params(), seed=7)
    assert _read(mini_root, "heldout.jsonl") == first
    _prepare(mini_root, _params(), seed=8)
    assert _read(mini_root, "heldout.jsonl") != first


def test_heldout_takes_the_fraction_of_each_databases_queries_with_all_their_questions():
    """Paraphrases of one query (spacing and case aside) go to the same side."""
    examples = [
        Example(db, f"q{i}{p}", f"SELECT {i} FROM t" if p else f"select  {i} from T", "")
        for db in ("a", "b")
        for i in range(20)
        for p in (0, 1)
    ]
    train, heldout, stats = split_heldout(examples, 0.1, seed=3)
    assert [sum(e.db_id == db for e in heldout) for db in ("a", "b")] == [4, 4]
    assert stats == {"groups_train": 36, "groups_heldout": 4}
    assert len(train) == 72 and not set(map(id, train)) & set(map(id, heldout))
    held_queries = {(e.db_id, e.query.split()[1]) for e in heldout}
    assert not held_queries & {(e.db_id, e.query.split()[1]) for e in train}


@pytest.mark.slow  # ~20-80 s: the fast tier stays a few minutes
def test_no_heldout_gold_query_is_trained_on_in_the_real_prepared_data(spider_dir, tmp_path):
    """The cpu profile's prepare (10% held out, schema mentions, one augmented copy of each
    row, written out here): no held-out gold query (normalised as the split normalises)
    appears among the SFT completions or GRPO prompts."""
    from sqlrl.data.prepare import query_key

    root = tmp_path
    (root / "data" / "raw").mkdir(parents=True)
    (root / "data" / "raw" / "spider").symlink_to(spider_dir)
    augment = dataclasses.replace(
        fixed_params().prepare.augment, copies=1, shuffle_schema=True, rename_prob=0.25
    )
    metrics = _prepare(root, _params(mark_schema_mentions=True, augment=augment), seed=42)
    heldout = _read(root, "heldout.jsonl")
    assert len(heldout) > 500 and metrics["train"]["groups_heldout"] > 0
    held = {(r["db_id"], query_key(r["gold"])) for r in heldout}
    trained = {
        (r["db_id"], query_key(r["completion"][0]["content"])) for r in _read(root, "sft.jsonl")
    }
    trained |= {(r["db_id"], query_key(r["gold_sql"])) for r in _read(root, "grpo.jsonl")}
    assert not held & trained


def test_ddl_format_with_sample_rows(mini_root):
    _prepare(mini_root, _params(schema_format="ddl", sample_rows=2), seed=1)
    user = _read(mini_root, "sft.jsonl")[0]["prompt"][1]["content"]
    assert "CREATE TABLE" in user and "2 example rows from" in user


def test_limits_cut_the_splits_for_the_smoke_profile(mini_root):
    metrics = _prepare(mini_root, _params(max_train_examples=5, max_dev_examples=3), seed=1)
    assert (metrics["train"]["sft"], metrics["dev"]["examples"]) == (5, 3)
    assert len(_read(mini_root, "dev.jsonl")) == 3


def test_missing_spider_says_to_pull(tmp_path):
    with pytest.raises(SpiderDataError, match="dvc pull"):
        _prepare(tmp_path, _params(), seed=1)


def test_malformed_file_is_named(mini_root):
    (mini_root / "data/raw/spider/dev.json").write_text("[{not json")
    with pytest.raises(SpiderDataError, match=r"dev.json: not valid JSON"):
        _prepare(mini_root, _params(), seed=1)


def test_unknown_db_id_names_the_file_and_item(mini_root):
    path = mini_root / "data/raw/spider/dev.json"
    items = json.loads(path.read_text())
    items[3]["db_id"] = "no_such_db"
    path.write_text(json.dumps(items))
    with pytest.raises(SpiderDataError, match=r"dev.json: item 3 names db_id 'no_such_db'"):
        _prepare(mini_root, _params(), seed=1)


def test_schema_without_tables_is_named(mini_root):
    path = mini_root / "data/raw/spider/tables.json"
    tables = json.loads(path.read_text())
    tables[0].update(
        table_names_original=[],
        table_names=[],
        column_names_original=[[-1, "*"]],
        column_types=["text"],
    )
    path.write_text(json.dumps(tables))
    with pytest.raises(
        SpiderDataError, match=f"'{tables[0]['db_id']}' has a schema with no tables"
    ):
        _prepare(mini_root, _params(), seed=1)


def test_unencodable_question_is_named(mini_root):
    path = mini_root / "data/raw/spider/train_spider.json"
    items = json.loads(path.read_text())
    items[2]["question"] = "Bad \ud800 surrogate"
    path.write_text(json.dumps(items))
    with pytest.raises(
        SpiderDataError, match=r"train_spider.json: item 2 question: not valid Unicode"
    ):
        _prepare(mini_root, _params(), seed=1)


def test_missing_field_is_named(mini_root):
    path = mini_root / "data/raw/spider/train_spider.json"
    items = json.loads(path.read_text())
    del items[0]["query"]
    path.write_text(json.dumps(items))
    with pytest.raises(SpiderDataError, match=r"train_spider.json: item 0 lacks query"):
        _prepare(mini_root, _params(), seed=1)


def test_schema_mentions_are_marked_in_every_split(mini_root):
    _prepare(mini_root, _params(mark_schema_mentions=True), seed=1)
    for name in ("sft.jsonl", "grpo.jsonl", "heldout.jsonl"):
        assert all("Schema mentions:" in r["prompt"][1]["content"] for r in _read(mini_root, name))
    dev = [r for r in _read(mini_root, "dev.jsonl") if r["prompt"]]
    assert dev and all("Schema mentions:" in r["prompt"][1]["content"] for r in dev)
    # the gold SQL and the plain question stay as they are
    assert all("Schema mentions" not in r["question"] for r in dev)


def test_augmentation_with_sample_rows_is_refused(mini_root):
    from sqlrl.params import ParamsError

    base = fixed_params().prepare.augment
    aug = dataclasses.replace(base, copies=1, rename_prob=0.5)
    with pytest.raises(ParamsError, match="sample_rows"):
        _prepare(mini_root, _params(schema_format="ddl", sample_rows=1, augment=aug), seed=1)


def _largest_db_tokens(root, rows):
    """The longest prompt per database in prepared rows, in Qwen2.5 tokens."""
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    tokenizer = build_qwen25_tokenizer()
    longest: dict[str, int] = {}
    for r in rows:
        n = len(
            tokenizer.apply_chat_template(
                r["prompt"], tokenize=True, return_dict=True, add_generation_prompt=True
            )["input_ids"]
        )
        longest[r["db_id"]] = max(longest.get(r["db_id"], 0), n)
    return longest


def test_max_prompt_tokens_trims_sample_rows_of_large_schemas_only(mini_root):
    """A schema whose prompt would not fit gets fewer sample rows, in every split, and the
    reductions are reported; schemas that fit keep all their rows."""
    from sqlrl.data.prompts import QUESTION_TOKENS, prompt_tokens, serialize_schema
    from sqlrl.data.spider import database_path, load_schemas

    spider = mini_root / "data" / "raw" / "spider"
    schemas = load_schemas(spider / "tables.json")
    params = _params(schema_format="ddl", sample_rows=3)
    sizes = {
        db: prompt_tokens(
            serialize_schema(schemas[db], "ddl", database_path(spider, db), 3), params.system_prompt
        )
        for db in DBS[:3]
    }
    biggest = max(sizes, key=sizes.get)
    budget = max(v for k, v in sizes.items() if k != biggest) + QUESTION_TOKENS  # all but one fit
    assert _prepare(mini_root, params, seed=1)["sample_rows_reduced"] == {}

    metrics = _prepare(mini_root, dataclasses.replace(params, max_prompt_tokens=budget), seed=1)
    assert set(metrics["sample_rows_reduced"]) == {biggest}
    assert metrics["sample_rows_reduced"][biggest] < 3
    rows = _read(mini_root, "sft.jsonl")
    longest_prompt = max(_largest_db_tokens(mini_root, rows).values())
    assert longest_prompt <= budget
    dev = [r for r in _read(mini_root, "dev.jsonl") if r["db_id"] == biggest and r["prompt"]]
    train = [r for r in rows if r["db_id"] == biggest]
    schema_of = lambda r: r["prompt"][1]["content"].split("\n\nQuestion:")[0]  # noqa: E731
    assert train and {schema_of(r) for r in train + dev} == {schema_of(train[0])}
    assert f"{metrics['sample_rows_reduced'][biggest]} example rows from" in schema_of(train[0])
    # what sft.max_length is checked against: whole rows (prompt + SQL), every one counted
    tokens = metrics["sft_tokens"]
    assert tokens["n"] == len(rows) and tokens["p50"] <= tokens["p95"] <= tokens["max"]
    assert longest_prompt < tokens["max"] < longest_prompt + 200  # a row is its prompt + its SQL


def test_rl_only_queries_go_to_grpo_alone_and_never_to_sft_or_heldout(mini_root):
    """prepare.rl_only_fraction: GRPO's prompts are whole training queries SFT never sees."""
    metrics = _prepare(mini_root, _params(heldout_fraction=0.1, rl_only_fraction=0.3), seed=5)
    sft, grpo = _read(mini_root, "sft.jsonl"), _read(mini_root, "grpo.jsonl")
    heldout = _read(mini_root, "heldout.jsonl")
    sft_golds = {r["completion"][0]["content"] for r in sft}
    assert grpo and all(normalize_sql_whitespace(r["gold_sql"]) not in sft_golds for r in grpo)
    assert {r["gold_sql"] for r in grpo}.isdisjoint({r["gold"] for r in heldout})
    train = metrics["train"]
    assert train["rl_only"] == len(grpo) and train["sft"] == len(sft)
    assert train["sft"] + train["rl_only"] + train["heldout"] == train["examples"]
    # about 30% of each database's queries; and none at all with the fraction at 0
    assert 0.2 < train["groups_rl_only"] / train["groups_train"] < 0.4
    _prepare(mini_root, _params(heldout_fraction=0.1), seed=5)
    shared_sft, shared_grpo = _read(mini_root, "sft.jsonl"), _read(mini_root, "grpo.jsonl")
    assert len(shared_grpo) == len(shared_sft) == len(sft) + len(grpo)
    assert {normalize_sql_whitespace(r["gold_sql"]) for r in shared_grpo} == {
        r["completion"][0]["content"] for r in shared_sft
    }
