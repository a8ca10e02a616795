"""Evaluation sets beside Spider dev (eval.sets): BIRD in its exact release format, scored by
BIRD's rule; a Spider-format set added by params alone; bad set data named in one line."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import subprocess
import sys

import pytest
import yaml

from sqlrl.benchmarks.bird import BIRD, bird_soft_f1
from sqlrl.benchmarks.sets import prepare_set
from sqlrl.benchmarks.spider import SPIDER
from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.data.spider import SpiderDataError
from sqlrl.eval.evaluate import Split, evaluate_model
from sqlrl.eval.score import score_predictions
from sqlrl.params import compose_params, params_from_dict
from tests.repo_tools import REPO_ROOT, tables_entry

# a BIRD-format release in miniature: one database present, one absent (as 8 of 11 are here)
BIRD_QUESTIONS = [
    {
        "question_id": 0,
        "db_id": "club",
        "question": "Which members paid dues?",
        "evidence": "paid dues refers to status = 'paid'",
        "SQL": "SELECT name FROM member WHERE status = 'paid'",
        "difficulty": "simple",
    },
    {
        "question_id": 1,
        "db_id": "club",
        "question": "List the cities of the members.",
        "evidence": "",
        "SQL": "SELECT city FROM member",
        "difficulty": "moderate",
    },
    {
        "question_id": 2,
        "db_id": "racing",
        "question": "Who won in 2009?",
        "evidence": "won refers to position = 1",
        "SQL": "SELECT driver FROM results WHERE year = 2009 AND position = 1",
        "difficulty": "challenging",
    },
]
MEMBERS = [("ann", "paid", "Oslo"), ("bob", "due", "Oslo"), ("cy", "paid", "Rome")]


@pytest.fixture
def bird_release(tmp_path):
    """data/raw/ holding `bird-dev/` laid out exactly as BIRD's dev release is."""
    root = tmp_path / "raw" / "bird-dev"
    db_dir = root / "dev_databases" / "club"
    (db_dir / "database_description").mkdir(parents=True)
    (db_dir / "database_description" / "member.csv").write_text(
        "original_column_name,column_name,column_description,data_format,value_description\n"
        "name,,the member's name,text,\nstatus,,dues status,text,paid or due\n"
        "city,,home city,text,\n"
    )
    with contextlib.closing(sqlite3.connect(db_dir / "club.sqlite")) as con:
        con.execute("CREATE TABLE member (name TEXT, status TEXT, city TEXT)")
        con.executemany("INSERT INTO member VALUES (?, ?, ?)", MEMBERS)
        con.commit()
    (root / "dev.json").write_text(json.dumps(BIRD_QUESTIONS))
    (root / "dev_tables.json").write_text(
        json.dumps(
            [
                tables_entry("club", "member", ["name", "status", "city"]),
                tables_entry("racing", "results", ["driver", "year", "position"]),
            ]
        )
    )
    (root / "dev_gold.sql").write_text(
        "".join(f"{q['SQL']}\t{q['db_id']}\n" for q in BIRD_QUESTIONS)
    )
    return tmp_path / "raw"


def _params(overrides=()):
    return params_from_dict(compose_params("smoke", list(overrides)))


def _bird_spec():
    return _params().eval.sets["bird_dev"]


def test_bird_rows_carry_evidence_in_the_prompt_and_skip_absent_databases(bird_release):
    settings = PromptSettings.from_prepare(_params().prepare)
    rows, counts = prepare_set("bird_dev", _bird_spec(), bird_release, settings)
    assert counts == {
        "format": "bird",
        "examples": 3,
        "runnable": 2,
        "skipped_db_absent": 1,
        "absent_databases": ["racing"],
    }
    paid, cities, absent = rows
    user = paid["prompt"][1]["content"]
    assert "Evidence: paid dues refers to status = 'paid'\nQuestion: Which members paid dues?" in (
        user
    )
    assert "Evidence:" not in cities["prompt"][1]["content"]  # none given: no empty line
    assert (paid["gold"], paid["difficulty"], paid["format"]) == (
        BIRD_QUESTIONS[0]["SQL"],
        "simple",
        "bird",
    )
    assert absent["prompt"] is None and absent["db_present"] is False


def test_bird_is_scored_on_result_sets_where_spider_compares_multisets(bird_release):
    """BIRD's evaluation_ex.py compares set(pred) == set(gold): a prediction with the rows in
    another order and without the duplicate Oslo counts for BIRD, not for Spider's rule."""
    db_dir = bird_release / "bird-dev" / "dev_databases"
    tables = bird_release / "bird-dev" / "dev_tables.json"
    gold = [("SELECT city FROM member", "club")]
    # UNION drops the duplicate (Spider's rule would strip a DISTINCT before comparing)
    pred = ["SELECT city FROM member UNION SELECT city FROM member ORDER BY city DESC"]
    bird = score_predictions(gold, pred, db_dir, tables, 1, benchmark=BIRD, levels=["simple"])
    spider = score_predictions(gold, pred, db_dir, tables, 1)
    assert (bird["ex"], spider["ex"]) == (1.0, 0.0)
    assert bird["by_difficulty"]["simple"] == {
        "n": 1,
        "ex": 1.0,
        "ex_all": 1.0,
        "em": None,
        "skipped": 0,
        # BIRD's Soft-F1 pairs rows in order: (Rome) against (Oslo), (Oslo) against (Rome)
        "soft_f1": 0.0,
    }
    assert bird["em"] is None  # BIRD reports no exact match
    # columns in another order are another result for BIRD (its rows are compared as tuples)
    swapped = ["SELECT status, name FROM member WHERE status = 'paid'"]
    gold_paid = [("SELECT name, status FROM member WHERE status = 'paid'", "club")]
    assert score_predictions(gold_paid, swapped, db_dir, tables, 1, benchmark=BIRD)["ex"] == 0.0


@pytest.mark.parametrize(
    ("gold", "pred", "f1"),
    [
        # duplicate rows are dropped on both sides before rows are paired
        ([(1, "a"), (1, "a"), (2, "b")], [(1, "a"), (2, "b"), (2, "b")], 1.0),
        # rows are paired in order: the same set in another order shares no value
        ([(1,), (2,)], [(2,), (1,)], 0.0),
        # row 1: 1 matched, x predicted-only, a gold-only (each 1/2); row 2 unpaired: gold-only
        # 1. P = 0.5 / 1, R = 0.5 / 2, F1 = 2 * 0.5 * 0.25 / 0.75
        ([(1, "a"), (2, "b")], [(1, "x")], 1 / 3),
        # an extra predicted row is 1 predicted-only: P = 1/2, R = 1
        ([(1,)], [(1,), (3,)], 2 / 3),
        # a value repeated in a predicted row is matched each time: matched 2/2, gold-only 1/2
        ([(1, 2)], [(1, 1)], 0.8),
        ([], [], 1.0),
        ([(1,)], [], 0.0),
        ([], [(1,)], 0.0),
    ],
)
def test_soft_f1_is_birds_row_by_row_partial_credit(gold, pred, f1):
    assert bird_soft_f1(gold, pred) == pytest.approx(f1)


def test_soft_f1_is_reported_next_to_bird_ex_per_difficulty(bird_release, tmp_path):
    """Scored through the scorer and its command line: EX and Soft-F1 disagree both ways."""
    release = bird_release / "bird-dev"
    gold = [(q["SQL"], q["db_id"]) for q in BIRD_QUESTIONS]
    preds = [
        # [ann, bob, cy] for [ann, cy]: EX 0; matched 1, predicted-only 2, gold-only 1: F1 0.4
        "SELECT name FROM member",
        # the same set of cities in another order: EX 1, Soft-F1 0
        "SELECT city FROM member ORDER BY city DESC",
        "SELECT 1",  # racing is absent: skipped, in neither average
    ]
    levels = [q["difficulty"] for q in BIRD_QUESTIONS]
    report = score_predictions(
        gold,
        preds,
        release / "dev_databases",
        release / "dev_tables.json",
        1,
        benchmark=BIRD,
        levels=levels,
    )
    assert (report["ex"], report["soft_f1"]) == (0.5, 0.2)
    assert [it["soft_f1"] for it in report["items"]] == [pytest.approx(0.4), 0.0, None]
    by_level = {level: m["soft_f1"] for level, m in report["by_difficulty"].items()}
    assert by_level == {"simple": 0.4, "moderate": 0.0, "challenging": None}
    failing = score_predictions(
        gold[:1],
        ["SELECT nope FROM member"],
        release / "dev_databases",
        release / "dev_tables.json",
        1,
        benchmark=BIRD,
    )
    assert failing["soft_f1"] == 0.0  # a query that fails scores 0, as BIRD counts it
    assert "soft_f1" not in score_predictions(
        gold[:1], preds[:1], release / "dev_databases", release / "dev_tables.json", 1
    )  # Spider's rule has no Soft-F1

    (tmp_path / "pred.sql").write_text("".join(p + "\n" for p in preds))
    done = _score_cli("--bird", release, "--pred", tmp_path / "pred.sql")
    assert done.returncode == 0, done.stderr
    assert "BIRD EX 50.00%  simple 0.00% (n=1)  moderate 100.00% (n=1)" in done.stdout
    assert "BIRD Soft-F1 20.00%  simple 40.00%  moderate 0.00%  challenging n/a" in done.stdout


def _score_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sqlrl.eval.score", "--no-progress", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )


def test_the_scorer_reads_birds_own_prediction_file_and_our_jsonl(bird_release, tmp_path):
    release = bird_release / "bird-dev"
    predictions = {
        "0": "SELECT name FROM member WHERE status = 'paid'\t----- bird -----\tclub",
        "1": "SELECT city FROM member WHERE name = 'ann'\t----- bird -----\tclub",
        "2": "SELECT 1\t----- bird -----\tracing",
    }
    (tmp_path / "predict_dev.json").write_text(json.dumps(predictions))
    done = _score_cli("--bird", release, "--pred", tmp_path / "predict_dev.json")
    assert done.returncode == 0, done.stderr
    assert "BIRD EX 50.00%  simple 100.00% (n=1)  moderate 0.00% (n=1)" in done.stdout
    assert "skipped=1" in done.stdout

    rows = [
        {"gold": q["SQL"], "db_id": q["db_id"], "pred": q["SQL"], "format": "bird"}
        | {"difficulty": q["difficulty"]}
        for q in BIRD_QUESTIONS
    ]
    (tmp_path / "bird.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _score_cli("--pred", tmp_path / "bird.jsonl", "--bird", release)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BIRD EX 100.00%")


def test_a_spider_format_set_added_by_params_alone_is_evaluated(tmp_path):
    """A user's own Spider-format set: a data folder and one params entry, no code."""
    raw = tmp_path / "raw"
    (raw / "mine").mkdir(parents=True)
    for pulled in (REPO_ROOT / "data" / "raw").iterdir():  # the sets params already name
        if pulled.is_dir():
            (raw / pulled.name).symlink_to(pulled)
    mine = [
        {
            "db_id": "concert_singer",
            "question": "How many stadiums?",
            "query": "SELECT count(*) FROM stadium",
        },
        {"db_id": "pets_1", "question": "How many pets?", "query": "SELECT count(*) FROM pets"},
    ]
    (raw / "mine" / "questions.json").write_text(json.dumps(mine))
    entry = (
        "+eval.sets.my_set={format: spider, questions: mine/questions.json, "
        "tables: spider/tables.json, databases: [spider/database]}"
    )
    data = compose_params("smoke", [entry])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "eval_sets"
    done = subprocess.run(
        [sys.executable, "-m", "stages.prepare_eval", "--params", str(tmp_path / "params.yaml")]
        + ["--raw", str(raw), "--out", str(out), "--metrics", str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "my_set (spider): 2 to evaluate" in done.stdout
    params = params_from_dict(data)

    class Gold:  # answers each question with its gold query
        def generate(self, prompts):
            return [answers[p] for p in prompts]

    rows = [json.loads(line) for line in (out / "my_set.jsonl").read_text().splitlines()]
    answers = {row["prompt"][1]["content"]: row["gold"] for row in rows}
    split = Split(out / "my_set.jsonl", raw / "spider" / "tables.json", SPIDER, required=True)
    metrics, predictions = evaluate_model(
        "models/x",
        params.eval,
        0,
        {"my_set": split},
        generator=Gold(),
        render=lambda messages: messages[1]["content"],
        workers=1,
    )
    assert (metrics["my_set"]["ex"], metrics["my_set"]["n"]) == (1.0, 2)
    assert [p["pred"] for p in predictions["my_set"]] == [q["query"] for q in mine]


def test_a_missing_or_malformed_set_file_is_one_line_naming_the_set_and_file(bird_release):
    settings = PromptSettings.from_prepare(_params().prepare)
    (bird_release / "bird-dev" / "dev.json").unlink()
    with pytest.raises(SpiderDataError, match=r"eval.sets.bird_dev: .*bird-dev/dev.json: no such"):
        prepare_set("bird_dev", _bird_spec(), bird_release, settings)
    broken = [dict(BIRD_QUESTIONS[0]), {k: v for k, v in BIRD_QUESTIONS[1].items() if k != "SQL"}]
    (bird_release / "bird-dev" / "dev.json").write_text(json.dumps(broken))
    with pytest.raises(SpiderDataError, match=r"eval.sets.bird_dev: .*dev.json: item 1 lacks SQL"):
        prepare_set("bird_dev", _bird_spec(), bird_release, settings)


def test_a_set_named_like_a_split_or_outside_the_raw_folder_is_refused_at_params_load():
    from sqlrl.params import ParamsError

    spec = "{format: bird, questions: q.json, tables: t.json, databases: [d]}"
    with pytest.raises(ParamsError, match=r"eval.sets: \['heldout'\] name the splits"):
        _params([f"+eval.sets.heldout={spec}"])
    bad = "{format: bird, questions: ../q.json, tables: t.json, databases: [d]}"
    with pytest.raises(ParamsError, match="eval.sets.mine: '../q.json' must be relative"):
        _params([f"+eval.sets.mine={bad}"])


# database_description/member.csv as BIRD's annotators saved theirs: CRLF line ends, a quoted
# field over two lines, a "commonsense evidence:" label, a description that only repeats the
# column's name, and a Windows-1252 byte (0x92, a curly apostrophe) that is not UTF-8
MEMBER_CSV = (
    b"original_column_name,column_name,column_description,data_format,value_description\r\n"
    b"name,,the member\x92s name,text,\r\n"
    b'status,,dues status,text,"commonsense evidence:\r\npaid or due"\r\n'
    b"city,city,city,text,\r\n"
)


def _described(bird_release, csv=MEMBER_CSV, **settings):
    """The prompts prepare_eval writes for the club questions, with column descriptions."""
    (bird_release / "bird-dev/dev_databases/club/database_description/member.csv").write_bytes(csv)
    prepare = dataclasses.replace(_params().prepare, column_descriptions=True, **settings)
    rows, _ = prepare_set(
        "bird_dev", _bird_spec(), bird_release, PromptSettings.from_prepare(prepare)
    )
    return rows


def test_column_descriptions_are_attached_to_each_described_column(bird_release):
    """Off by default (the fixture's own member.csv never shows); on, BIRD's notes follow
    their columns in both schema formats, a note that repeats the name left out."""
    plain, _ = prepare_set(
        "bird_dev", _bird_spec(), bird_release, PromptSettings.from_prepare(_params().prepare)
    )
    assert "member | name, status, city\n" in plain[0]["prompt"][1]["content"]
    compact = _described(bird_release, schema_format="compact")[0]["prompt"][1]["content"]
    assert (
        "member | name (the member\u2019s name), status (dues status; paid or due), city\n"
        in compact
    )
    ddl = _described(bird_release, schema_format="ddl")[0]["prompt"][1]["content"]
    assert (
        "CREATE TABLE member (\n"
        "  name TEXT, -- the member\u2019s name\n"
        "  status TEXT, -- dues status; paid or due\n"
        "  city TEXT\n"
        ");"
    ) in ddl


def test_the_server_builds_the_described_prompt_prepare_wrote(bird_release):
    """Training, evaluation and serving share the prompt path: the server's builder, given
    the same databases, sends the prompt prepare_eval wrote (without BIRD's evidence)."""
    from sqlrl.request_input import RequestInput

    row = _described(bird_release, schema_format="ddl")[1]  # the question without evidence
    release = bird_release / "bird-dev"
    server = bird_release.parent / "served"
    (server / "database").mkdir(parents=True)
    (server / "database" / "club").symlink_to(release / "dev_databases" / "club")
    (server / "tables.json").write_bytes((release / "dev_tables.json").read_bytes())
    settings = PromptSettings.from_prepare(
        dataclasses.replace(_params().prepare, column_descriptions=True, schema_format="ddl")
    )
    builder = RequestInput(settings, server, local=True)
    assert builder.messages(row["question"], db_id="club") == row["prompt"]


def test_descriptions_absent_or_malformed(bird_release, tmp_path):
    """No database_description folder: no notes and no error; a file that is not BIRD's
    format: one line naming it."""
    from sqlrl.data.descriptions import describe, read_descriptions

    assert read_descriptions(tmp_path) == {}
    # BIRD's toxicology: Windows-1252 bullets saved as U+0095, a byte lost as U+FFFD
    note = describe("element", {"value_description": "\x95 cl: chlorine \x95 c: \ufffdcarbon"})
    assert note == "\u2022 cl: chlorine \u2022 c: carbon"
    with pytest.raises(SpiderDataError, match=r"member\.csv:1: no original_column_name column"):
        _described(bird_release, b"column,meaning\nname,who\n")
