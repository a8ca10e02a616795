"""A benchmark family is one file plus its registry line: a family defined here, in the test
module, is registered and runs through the real scoring path (the judge, in-process and in a
spawned worker pool; score_predictions; the score command; evaluation's greedy and maj@k
scoring and its vote) on Spider dev questions against the real SQLite databases, giving
verdicts that differ from Spider's on crafted pairs. No module of sqlrl is edited for it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from sqlrl.answer import vote
from sqlrl.benchmarks import (
    BENCHMARKS,
    get_benchmark,
    level_report_keys,
    register_benchmark,
    unregister_benchmark,
)
from sqlrl.benchmarks.base import Benchmark, item_error, percent
from sqlrl.benchmarks.spider import SPIDER
from sqlrl.data.rows import recorded_path
from sqlrl.data.spider import Fields, database_path
from sqlrl.eval.evaluate import evaluate_split
from sqlrl.eval.score import main, score_predictions
from sqlrl.params import BENCHMARK_FORMATS
from sqlrl.sql.executor import Verdict
from sqlrl.sql.judge import Judge, JudgePool
from stages.evaluate import _benchmark_sets


@dataclass(frozen=True)
class FirstColumn(Benchmark):
    """A made-up family: a result is the set of its first column's values (what a question
    asking for names cares about), so other columns, row order and duplicates do not count.
    Its questions carry a `topic` level."""

    def compare(self, gold_rows, pred_rows, gold_sql):
        return self.same_result(gold_rows, pred_rows), None

    def same_result(self, a, b):
        return {row[0] for row in a if row} == {row[0] for row in b if row}

    def item(self, index, gold_sql, db_id, pred, judgement, schema, level):
        status = judgement.status
        return {
            "index": index,
            "db_id": db_id,
            "topic": level,
            "status": status,
            "ex": None if status == "skipped" else int(judgement.match),
            "em": None,
            "error": item_error(judgement, db_id, schema, "the tables file"),
            "gold_failed": judgement.gold_status not in ("ok", "skipped"),
            "gold_trivial": judgement.gold_trivial,
        }

    def report_lines(self, report, out):
        return [f"first-column EX {percent(report['ex'])} n={report['n']}"]


FIRST_COLUMN = FirstColumn(
    name="first_column",
    fields=Fields(question="question", query="query"),
    level_key="topic",
    levels=("people", "places"),
    levels_given=True,
)

DB = "concert_singer"
# (gold, prediction, topic): the same names with another second column, in another order,
# and with a duplicate: equal sets of first columns, unequal results for Spider
PAIRS = [
    ("SELECT name, country FROM singer", "SELECT name, age FROM singer", "people"),
    ("SELECT name FROM singer ORDER BY age", "SELECT name FROM singer ORDER BY age DESC", "people"),
    (
        "SELECT country FROM singer",
        "SELECT country FROM singer GROUP BY country",
        "places",
    ),
    ("SELECT name FROM singer", "SELECT country FROM singer", "places"),  # wrong for both
]


@pytest.fixture
def first_column():
    """FIRST_COLUMN registered for one test, and gone after it."""
    register_benchmark(FIRST_COLUMN)
    yield FIRST_COLUMN
    unregister_benchmark(FIRST_COLUMN.name)


@pytest.fixture(scope="module")
def db_path(spider_dir):
    return recorded_path(database_path(spider_dir, DB))


def test_the_registry_holds_spider_and_bird_and_gives_params_their_names():
    assert tuple(BENCHMARKS) == BENCHMARK_FORMATS == ("spider", "bird")
    assert get_benchmark("spider") is SPIDER
    with pytest.raises(ValueError, match="unknown benchmark 'nope': one of 'spider', 'bird'"):
        get_benchmark("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_benchmark(SPIDER)


def test_a_family_defined_here_is_looked_up_by_its_name(first_column, tmp_path):
    assert get_benchmark("first_column") is first_column
    assert level_report_keys() == ("by_hardness", "by_difficulty", "by_topic")
    # the evaluate stage's edge: a set of eval.sets whose `format` names it
    (tmp_path / "mine.jsonl").write_text("")
    spec = SimpleNamespace(format="first_column", tables="spider/tables.json")
    (split,) = _benchmark_sets({"mine": spec}, str(tmp_path), "raw").values()
    assert split.benchmark is first_column


def test_the_judge_scores_by_the_registered_family(first_column, db_path):
    spider, mine = Judge(), Judge(benchmark=first_column)
    verdicts = [
        (spider.judge(db_path, gold, pred).match, mine.judge(db_path, gold, pred).match)
        for gold, pred, _ in PAIRS
    ]
    assert verdicts == [(False, True), (False, True), (False, True), (False, False)]


def test_a_spawned_judge_pool_gets_the_family(first_column, db_path):
    """The family pickles into the pool's worker processes (a batch of 32 distinct items is
    judged there, not in-process)."""
    items = [
        (db_path, "SELECT name FROM singer", f"SELECT name, {i} FROM singer") for i in range(32)
    ]
    pool = JudgePool(workers=2, benchmark=first_column)
    try:
        assert all(j.match for j in pool.judge_many(items))
        assert pool._pool is not None  # the workers judged them: no in-process fallback
    finally:
        pool.close()


def test_score_predictions_reports_by_the_familys_items_and_levels(first_column, spider_dir):
    gold = [(g, DB) for g, _, _ in PAIRS]
    preds = [p for _, p, _ in PAIRS]
    args = (gold, preds, spider_dir / "database", spider_dir / "tables.json", 1)
    kwargs = dict(progress=False)
    spider = score_predictions(*args, **kwargs)
    mine = score_predictions(*args, **kwargs, benchmark=first_column, levels=[t for *_, t in PAIRS])
    assert spider["ex"] == 0.0 and mine["ex"] == 0.75
    assert [it["ex"] for it in mine["items"]] == [1, 1, 1, 0]
    assert mine["by_topic"]["people"]["ex"] == 1.0 and mine["by_topic"]["places"]["ex"] == 0.5
    assert "by_hardness" not in mine and mine["em"] is None


def test_the_score_command_takes_the_family_from_the_rows(
    first_column, spider_dir, tmp_path, capsys
):
    rows = [
        {"gold": g, "db_id": DB, "pred": p, "format": "first_column", "topic": t}
        for g, p, t in PAIRS
    ]
    path = tmp_path / "preds.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "report.json"
    argv = ["--pred", str(path), "--spider", str(spider_dir), "--workers", "1"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    assert capsys.readouterr().out == "first-column EX 75.00% n=4\n"
    assert json.loads(out.read_text())["by_topic"]["places"]["n"] == 2


def test_evaluation_scores_and_votes_by_the_family(first_column, spider_dir, db_path):
    """Greedy EX and maj@3 through evaluate_split: the family's equality decides both the
    verdict and which sampled answers vote together."""
    rows = [
        {
            "question": f"q{i}",
            "db_id": DB,
            "gold": gold,
            "db_present": True,
            "db_path": db_path,
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "topic": topic,
        }
        for i, (gold, _, topic) in enumerate(PAIRS)
    ]
    greedy = {f"q{i}": pred for i, (_, pred, _) in enumerate(PAIRS)}
    samples = [  # the first sample returns other names; the other two name the same singers
        "SELECT name FROM singer WHERE age > 40",
        "SELECT name, age FROM singer",
        "SELECT name, country FROM singer ORDER BY country",
    ]

    class Model:
        def generate(self, prompts):
            return [greedy[p] for p in prompts]

        def sample(self, prompts, n, temperature, seed):
            return [samples[:n] for _ in prompts]

    def evaluate(benchmark):
        return evaluate_split(
            rows[:1],
            Model(),
            lambda messages: messages[-1]["content"],
            tables_json=spider_dir / "tables.json",
            benchmark=benchmark,
            vote_samples=3,
            workers=1,
        )

    spider, (spider_pred,) = evaluate(SPIDER)
    mine, (mine_pred,) = evaluate(first_column)
    assert spider["ex"] == 0.0 and mine["ex"] == 1.0
    # Spider: three results, three groups of one, the first wins (wrong); first column: the
    # last two are one group of two, which wins (right)
    assert (spider_pred["votes"], spider_pred["maj_ex"]) == (1, 0)
    assert (mine_pred["votes"], mine_pred["maj_ex"]) == (2, 1)
    assert mine_pred["maj_pred"] == samples[1]
    assert mine["by_topic"]["people"]["n"] == 1 and "by_hardness" not in mine


def test_the_vote_groups_by_the_familys_equality(first_column):
    def ok(*rows):
        return Verdict("ok", rows)

    verdicts = [ok((1, "a")), ok((2, "b")), ok((2, "c")), Verdict("error")]
    assert vote(verdicts) == (0, 1)  # Spider: three different results
    assert vote(verdicts, first_column) == (1, 2)  # first columns: 2 and 2


def test_unregistered_after_the_fixture():
    assert "first_column" not in BENCHMARKS
    assert level_report_keys() == ("by_hardness", "by_difficulty")
