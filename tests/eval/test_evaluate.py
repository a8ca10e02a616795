"""Evaluation (sqlrl/eval/evaluate.py, stages/evaluate.py) on real Spider dev rows.

The model is replaced by fake backends that answer with chosen SQL, so every verdict is known
in advance; one test runs the real stage on a tiny model.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import yaml

from sqlrl.answer import vote
from sqlrl.benchmarks.sets import prepare_set
from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.eval.evaluate import evaluate_model, evaluate_split
from sqlrl.jsonio import read_json, read_jsonl
from sqlrl.params import EvalParams, params_from_dict
from tests.repo_tools import REPO_ROOT, fixed_params_dict

RAW_DIR = REPO_ROOT / "data" / "raw"

GOLD_COUNT = "SELECT count(*) FROM singer"
# dev rows 0-9 (concert_singer) -> (what the fake model says, ex, em, status)
ANSWERS = {
    0: ("```sql\nSELECT count(*) FROM singer;\n```", 1, 1, "ok"),  # fenced gold
    1: ("SELECT count(Singer_ID) FROM singer", 1, 0, "ok"),  # same result, other SQL
    2: (None, 1, 1, "ok"),  # gold as is
    3: ("SELECT name, country, age FROM singer ORDER BY age ASC", 0, 0, "ok"),  # wrong order
    4: ("I do not know.", 0, 0, "error"),  # garbage
    5: (None, 1, 1, "ok"),
    6: ("SELECT nope FROM singer", 0, 0, "error"),  # no such column
    7: ("SQL: {gold};", 1, 1, "ok"),  # labelled gold
    8: ("SELECT DISTINCT country FROM singer WHERE age > 40", 0, 1, "ok"),  # EM ignores values
    9: (None, 1, 1, "ok"),
}
ABSENT = 2  # wta_1 rows (database absent from this copy of Spider)


def _eval_params() -> EvalParams:
    """Greedy on transformers, batches of 4, no repair, no extra sets: the fake models' eval."""
    return EvalParams(
        batch_size=4,
        max_new_tokens=8,
        use_vllm=False,
        num_samples=1,
        temperature=0.8,
        schema_repair=False,
        constrained=False,
        vote_models=[],
        sets={},
    )


def _render(messages):
    return messages[-1]["content"]


@pytest.fixture(scope="module")
def dev_rows(prepared_dir):
    rows = read_jsonl(prepared_dir / "dev.jsonl")
    absent = [r for r in rows if r["db_id"] == "wta_1"][:ABSENT]
    assert len(absent) == ABSENT and all(r["prompt"] is None for r in absent)
    # interleave an absent row to check that order and skipping survive
    return rows[:5] + [absent[0]] + rows[5:10] + [absent[1]]


def _answer_for(row, i):
    text = ANSWERS[i][0]
    return row["gold"] if text is None else text.replace("{gold}", row["gold"])


class FakeModel:
    """Answers each prompt from a table; records what it was asked."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.calls = []

    def generate(self, prompts):
        self.calls.append(list(prompts))
        return [self.answers[p] for p in prompts]


def _fake_for(rows):
    answers, k = {}, 0
    for row in rows:
        if row["prompt"] is not None:
            answers[_render(row["prompt"])] = _answer_for(row, k)
            k += 1
    return FakeModel(answers)


def test_evaluate_split_end_to_end_with_known_answers(dev_rows, spider_dir):
    from sqlrl.eval.spider_eval import hardness

    fake = _fake_for(dev_rows)
    metrics, preds = evaluate_split(
        dev_rows, fake, _render, tables_json=spider_dir / "tables.json", workers=1
    )

    # absent databases: not generated for, skipped, never scored
    assert len(fake.calls) == 1 and len(fake.calls[0]) == 10
    assert all("wta_1" not in p for p in fake.calls[0])
    assert [p["question"] for p in preds] == [r["question"] for r in dev_rows]
    skipped = [p for p in preds if p["status"] == "skipped"]
    assert [p["db_id"] for p in skipped] == ["wta_1"] * ABSENT
    assert all(p["ex"] is None and p["em"] is None and p["pred"] is None for p in skipped)
    assert skipped[0]["error"] == "database absent: data/raw/spider/database/wta_1/wta_1.sqlite"

    tables = {t["db_id"]: t for t in json.loads((spider_dir / "tables.json").read_text())}
    scored = [p for p in preds if p["status"] != "skipped"]
    for i, p in enumerate(scored):
        _, ex, em, status = ANSWERS[i]
        assert (p["ex"], p["em"], p["status"]) == (ex, em, status), (i, p)
        assert p["hardness"] == hardness(p["gold"], tables[p["db_id"]])
        assert {
            "question",
            "db_id",
            "gold",
            "pred",
            "ex",
            "em",
            "hardness",
            "status",
            "error",
            "output",
        } <= set(p)
    assert scored[0]["pred"] == GOLD_COUNT  # extracted from the fenced answer
    assert scored[4]["error"] and scored[6]["error"]

    assert metrics["n"] == 10 and metrics["skipped"] == ABSENT
    assert metrics["ex"] == pytest.approx(0.6) and metrics["em"] == pytest.approx(0.6)
    assert metrics["executable"] == pytest.approx(0.8)
    assert metrics["num_samples"] == 1
    assert metrics["generation_seconds"] >= 0 and "examples_per_second" in metrics
    by = metrics["by_hardness"]
    for level in ("easy", "medium", "hard", "extra"):
        mine = [p for p in scored if p["hardness"] == level]
        if mine:
            assert by[level]["n"] == len(mine)
            assert by[level]["ex"] == pytest.approx(sum(p["ex"] for p in mine) / len(mine))
            assert by[level]["em"] == pytest.approx(sum(p["em"] for p in mine) / len(mine))
    # answers 4 (prose) and 6 (an unknown column) do not run; nothing timed out
    assert metrics["failures"] == {"sql_error": 2, "timeout": 0}


def test_ex_all_counts_skipped_questions_as_wrong(dev_rows, prepared_dir, spider_dir, tmp_path):
    """ex stays over the questions that could run; ex_all is over every question, as published
    Spider numbers are (dev: all 1,034 questions, wta_1 included), per split and hardness."""
    absent = [r for r in read_jsonl(prepared_dir / "dev.jsonl") if r["db_id"] == "wta_1"]
    heldout = read_jsonl(prepared_dir / "heldout.jsonl")[:3] + absent[2:3]
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev_rows))
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in heldout))
    fake = _fake_for(dev_rows)
    fake.answers.update({_render(r["prompt"]): r["gold"] for r in heldout if r["prompt"]})
    params = _eval_params()
    metrics, preds = evaluate_model(
        "models/x",
        params,
        0,
        {"dev": tmp_path / "dev.jsonl", "heldout": tmp_path / "heldout.jsonl"},
        generator=fake,
        render=_render,
        spider_dir=spider_dir,
    )
    # dev: 6 right of the 10 that ran, 2 skipped
    dev = metrics["dev"]
    assert (dev["ex"], dev["n"], dev["skipped"]) == (pytest.approx(0.6), 10, ABSENT)
    assert dev["ex_all"] == pytest.approx(6 / 12, abs=1e-6)
    for level, m in dev["by_hardness"].items():
        rows = [p for p in preds["dev"] if p["hardness"] == level]
        if rows:
            assert m["ex_all"] == pytest.approx(
                sum(p["ex"] or 0 for p in rows) / len(rows), abs=1e-6
            ), level
            assert m["n"] + m["skipped"] == len(rows)
    assert sum(m["skipped"] for m in dev["by_hardness"].values()) == ABSENT
    # held-out: all 3 that ran are right, 1 skipped
    held = metrics["heldout"]
    assert (held["ex"], held["n"], held["skipped"]) == (1.0, 3, 1)
    assert held["ex_all"] == 0.75


class FakeSampler:
    def __init__(self, samples: dict[str, list[str]]):
        self.samples = samples
        self.calls = []

    def generate(self, prompts):  # greedy: the first candidate
        return [self.samples[p][0] for p in prompts]

    def sample(self, prompts, n, temperature, seed):
        self.calls.append((list(prompts), n, temperature, seed))
        return [self.samples[p][:n] for p in prompts]


def test_self_consistency_votes_by_execution_result(dev_rows, spider_dir):
    rows = [dev_rows[0], dev_rows[2], dev_rows[5], dev_rows[4]]  # count, order, absent, avg
    samples = {
        # 6 singers: three candidates agree (6), one says 9, one fails -> the first "6" wins;
        # the sixth candidate is beyond num_samples
        _render(rows[0]["prompt"]): [
            "SELECT count(*) FROM stadium",
            "oops",
            GOLD_COUNT,
            "SELECT count(*) FROM concert",
            "SELECT 6",
            "SELECT 9",
        ],
        # the majority is wrong (a filter that drops singers): voting picks it
        _render(rows[1]["prompt"]): [rows[1]["gold"]]
        + ["SELECT name, country, age FROM singer WHERE age > 30"] * 2
        + ["x", "y", "z"],
        # nothing runs: the first candidate is kept, with no votes
        _render(rows[3]["prompt"]): ["bad one", "worse", "x", "y", "z", "w"],
    }
    sampler = FakeSampler(samples)
    metrics, preds = evaluate_split(
        rows,
        sampler,
        _render,
        vote_samples=5,
        temperature=0.7,
        seed=3,
        tables_json=spider_dir / "tables.json",
        workers=1,
    )
    (call,) = sampler.calls
    assert call[1:] == (5, 0.7, 3) and len(call[0]) == 3
    # maj@5 next to greedy (each question's first candidate), on the same questions
    assert [p.get("maj_pred") for p in preds] == [
        GOLD_COUNT,
        samples[call[0][1]][1],
        None,
        "bad one",
    ]
    assert [p.get("votes") for p in preds] == [3, 2, None, 0]
    assert [p.get("maj_ex") for p in preds] == [1, 0, None, 0]
    assert [p["pred"] for p in preds] == [
        "SELECT count(*) FROM stadium",
        rows[1]["gold"],
        None,
        "bad one",
    ]
    assert [p["ex"] for p in preds] == [0, 1, None, 0]
    assert [p["status"] for p in preds] == ["ok", "ok", "skipped", "error"]
    assert (metrics["n"], metrics["skipped"], metrics["num_samples"]) == (3, 1, 1)
    assert metrics["ex"] == pytest.approx(1 / 3)
    assert (metrics["maj"]["k"], metrics["maj"]["ex"]) == (5, pytest.approx(1 / 3))


def test_vote_picks_the_largest_group_and_the_first_on_ties():
    ok = lambda rows: SimpleNamespace(status="ok", rows=rows)  # noqa: E731
    bad = SimpleNamespace(status="error", rows=None)
    assert vote([ok(((1,),)), ok(((2,),)), ok(((2,),)), bad]) == (1, 2)
    assert vote([bad, ok(((1,), (2,))), ok(((2,), (1,)))]) == (1, 2)  # row order ignored
    assert vote([ok(((1, "a"),)), ok((("a", 1.0),)), ok(((2, "b"),))]) == (0, 2)  # columns too
    assert vote([ok(((1,),)), ok(((2,),))]) == (0, 1)  # tie: first group
    assert vote([bad, bad]) == (0, 0)


def test_evaluate_model_heldout_split_and_empty_splits(
    dev_rows, prepared_dir, spider_dir, tmp_path
):
    heldout = read_jsonl(prepared_dir / "heldout.jsonl")[:3]
    assert len(heldout) == 3
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev_rows))
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in heldout))
    (tmp_path / "empty.jsonl").write_text("")
    fake = _fake_for(dev_rows)
    fake.answers.update({_render(r["prompt"]): r["gold"] for r in heldout})
    params = _eval_params()
    metrics, preds = evaluate_model(
        "models/x",
        params,
        0,
        {"dev": tmp_path / "dev.jsonl", "heldout": tmp_path / "heldout.jsonl"},
        generator=fake,
        render=_render,
        spider_dir=spider_dir,
    )
    assert metrics["dev"]["ex"] == pytest.approx(0.6) and metrics["dev"]["n"] == 10
    assert metrics["heldout"]["ex"] == 1.0 and metrics["heldout"]["n"] == len(heldout)
    assert [p["pred"] for p in preds["heldout"]] == [r["gold"] for r in heldout]

    metrics, preds = evaluate_model(
        "models/x",
        params,
        0,
        {"dev": tmp_path / "dev.jsonl", "heldout": tmp_path / "empty.jsonl"},
        generator=fake,
        render=_render,
        spider_dir=spider_dir,
    )
    assert "heldout" not in metrics and preds["heldout"] == []


def test_stage_writes_metrics_and_predictions_with_a_tiny_model(
    tiny,
    prepared_dir,
    spider_dir,
    tmp_path,
    capsys,
):
    from stages import evaluate as stage
    from stages import parse_stage_args

    _, _, model_path = tiny
    rows = read_jsonl(prepared_dir / "dev.jsonl")
    dev = rows[:3] + [r for r in rows if r["db_id"] == "wta_1"][:1]
    prepared = tmp_path / "data" / "prepared"
    prepared.mkdir(parents=True)
    (prepared / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev))
    (prepared / "heldout.jsonl").write_text("")
    shutil.copytree(model_path, tmp_path / "models" / "tiny")
    params = fixed_params_dict(
        "eval.max_new_tokens=6", "eval.batch_size=8", "eval.num_samples=1", "eval.use_vllm=false"
    )
    bird = params["eval"]["sets"]["bird_dev"]
    params["eval"]["sets"] = {"bird_dev": bird}  # one benchmark set, a few of its rows
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    settings = PromptSettings.from_prepare(params_from_dict(params).prepare)
    bird_rows, _ = prepare_set(
        "bird_dev",
        params_from_dict(params).eval.sets["bird_dev"],
        RAW_DIR,
        settings,
        max_examples=2,
    )
    bird_rows = [r for r in bird_rows if r["prompt"]] + [bird_rows[0]]  # 2 runnable, 1 absent
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "bird_dev.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in bird_rows)
    )

    def run(model: str) -> int:
        out = tmp_path / "data" / "predictions"
        argv = ["--model", str(tmp_path / "models" / model), "--spider", str(spider_dir)]
        argv += ["--dev", str(prepared / "dev.jsonl"), "--heldout", str(prepared / "heldout.jsonl")]
        argv += ["--sets", str(tmp_path / "sets"), "--raw", str(RAW_DIR)]
        argv += ["--set-predictions", str(out / f"{model}_sets")]
        argv += ["--predictions", str(out / f"{model}.jsonl")]
        argv += ["--heldout-predictions", str(out / f"{model}_heldout.jsonl")]
        argv += ["--metrics", str(tmp_path / "metrics" / f"eval_{model}.json")]
        argv += ["--headline", str(tmp_path / "metrics" / f"headline_{model}.json")]
        argv += ["--params", str(tmp_path / "params.yaml")]
        return stage.main(parse_stage_args("evaluate", stage.arguments, argv=argv))

    assert run("tiny") == 0
    metrics = read_json(tmp_path / "metrics" / "eval_tiny.json")
    assert set(metrics) == {"dev", "bird_dev", "generation"}  # held-out has no rows: left out
    headline = read_json(tmp_path / "metrics" / "headline_tiny.json")
    assert headline == {
        "dev": {"ex": metrics["dev"]["ex"], "em": metrics["dev"]["em"]},
        "bird_dev": {"ex": metrics["bird_dev"]["ex"]},  # BIRD has no EM
    }
    bird_metrics = metrics["bird_dev"]
    assert (bird_metrics["n"], bird_metrics["skipped"]) == (2, 1)
    by_difficulty = bird_metrics["by_difficulty"]
    assert sum(level["n"] for level in by_difficulty.values()) == 2
    assert set(by_difficulty) == {"simple", "moderate", "challenging"}
    bird_preds = read_jsonl(tmp_path / "data" / "predictions" / "tiny_sets" / "bird_dev.jsonl")
    assert [p["status"] for p in bird_preds][-1] == "skipped"
    assert {p["format"] for p in bird_preds} == {"bird"} and all(
        p["difficulty"] for p in bird_preds
    )
    scored = metrics["dev"]
    assert (scored["n"], scored["skipped"]) == (3, 1)
    assert scored["ex_all"] == pytest.approx(scored["ex"] * 3 / 4, abs=1e-6)
    assert scored["generated_tokens"] <= 3 * 6
    lines = (tmp_path / "data" / "predictions" / "tiny.jsonl").read_text().splitlines()
    predictions = [json.loads(x) for x in lines]
    assert [p["question"] for p in predictions] == [r["question"] for r in dev]
    # the metrics are the predictions file's: the skipped row is wta_1's, EX the scored rows' mean
    assert [p["status"] == "skipped" for p in predictions] == [False, False, False, True]
    assert scored["ex"] == pytest.approx(sum(p["ex"] for p in predictions[:3]) / 3, abs=1e-6)
    assert (tmp_path / "data" / "predictions" / "tiny_heldout.jsonl").read_text() == ""
    out = capsys.readouterr().out
    assert "evaluate@tiny: dev EX" in out and "EX with skipped as wrong" in out and "of 4" in out
    assert run("missing") == 1


def test_only_absent_databases_loads_no_model(dev_rows, spider_dir, tmp_path):
    absent = [r for r in dev_rows if r["prompt"] is None]
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in absent))
    params = _eval_params()
    metrics, preds = evaluate_model(
        tmp_path / "no-such-model",
        params,
        0,
        {"dev": tmp_path / "dev.jsonl", "heldout": tmp_path / "missing.jsonl"},
        spider_dir=spider_dir,
    )
    dev = metrics["dev"]
    assert (dev["n"], dev["skipped"], dev["ex"]) == (0, ABSENT, None)
    assert dev["ex_all"] == 0.0  # every question counted, none answered
    assert dev["executable"] is None and "heldout" not in metrics
    assert [p["status"] for p in preds["dev"]] == ["skipped"] * ABSENT and preds["heldout"] == []
    with pytest.raises(FileNotFoundError):
        evaluate_model(
            tmp_path / "no-such-model",
            params,
            0,
            {"dev": tmp_path / "nope.jsonl"},
            spider_dir=spider_dir,
        )


def test_a_damaged_database_is_an_error_naming_it_not_a_zero(dev_rows, spider_dir, tmp_path):
    """A database file that is present but not readable SQLite would make every question on
    it score as wrong; evaluation stops and names the file instead."""
    from sqlrl.eval.evaluate import DatabaseFileError

    copy = tmp_path / "spider"
    (copy / "database" / "concert_singer").mkdir(parents=True)
    (copy / "tables.json").symlink_to(spider_dir / "tables.json")
    damaged = copy / "database" / "concert_singer" / "concert_singer.sqlite"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\x07" * 4096)
    # the rows name the copy's file, as prepare records each row's database
    rows = [{**r, "db_path": str(damaged)} for r in dev_rows if r["db_id"] == "concert_singer"]
    params = _eval_params()
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatabaseFileError, match=str(damaged)):
        evaluate_model(
            "models/x",
            params,
            0,
            {"dev": tmp_path / "dev.jsonl"},
            generator=_fake_for(rows),
            render=_render,
            spider_dir=copy,
        )
    damaged.write_bytes(b"not a database at all")
    with pytest.raises(DatabaseFileError, match="cannot be read"):
        evaluate_model(
            "models/x",
            params,
            0,
            {"dev": tmp_path / "dev.jsonl"},
            generator=_fake_for(rows),
            render=_render,
            spider_dir=copy,
        )


def test_voting_judges_candidates_under_the_scoring_time_limit(dev_rows, monkeypatch):
    """Voting runs each candidate under the limit scoring will use: a query that scoring
    times out gets no vote (under the reward's longer 5 s default the two slow ones won)."""
    from sqlrl.eval import score
    from sqlrl.eval.voting import self_consistency

    monkeypatch.setattr(score, "EVAL_TIMEOUT_S", 0.2)
    slow = (
        # tens of seconds of SQLite work on any CPU: far past the 0.2 s limit everywhere
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000000) "
        "SELECT count(*) FROM c"
    )
    chosen, votes, _ = self_consistency([[slow, slow, "SELECT 7"]], [dev_rows[0]["db_path"]])
    assert (chosen, votes) == (["SELECT 7"], [1])
