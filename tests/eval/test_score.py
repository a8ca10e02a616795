"""The scorer: the official evaluator's interface, our report, skipped databases counted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sqlrl.eval.score import main, read_gold, score_predictions
from tests.repo_tools import REPO_ROOT, SPIDER_DIR


@pytest.fixture(scope="module")
def dev_gold(spider_dir):
    return read_gold(spider_dir / "dev_gold.sql")


@pytest.fixture(scope="module")
def gold_vs_gold(spider_dir, dev_gold):
    """All 1034 dev gold queries scored against themselves (how long that takes:
    benchmarks/bench_reward.py)."""
    return score_predictions(
        dev_gold,
        [sql for sql, _ in dev_gold],
        spider_dir / "database",
        spider_dir / "tables.json",
        workers=2,
        progress=False,
    )


def test_gold_against_itself_scores_one_on_every_present_database(gold_vs_gold):
    report = gold_vs_gold
    assert report["total"] == 1034
    assert report["skipped"] == 62  # wta_1 is absent from this copy of Spider
    assert report["n"] == 972
    assert report["ex"] == 1.0
    assert report["errors"] == {"error": 0, "timeout": 0}
    items = report["items"]
    assert len(items) == 1034 and [it["index"] for it in items] == list(range(1034))
    assert all(it["ex"] == 1 and it["status"] == "ok" for it in items if it["db_id"] != "wta_1")
    assert all(
        it["ex"] is None and it["em"] is None and it["status"] == "skipped"
        for it in items
        if it["db_id"] == "wta_1"
    )


def test_gold_against_itself_is_an_exact_match_with_spider_hardness(gold_vs_gold):
    report = gold_vs_gold
    assert report["em"] == 1.0
    levels = report["by_hardness"]
    assert sum(levels[h]["n"] for h in ("easy", "medium", "hard", "extra")) == 972
    assert sum(levels[h]["n"] + levels[h]["skipped"] for h in levels) == 1034
    # Spider dev's published hardness split (all 1034 questions)
    assert {h: levels[h]["n"] + levels[h]["skipped"] for h in levels} == {
        "easy": 248,
        "medium": 446,
        "hard": 174,
        "extra": 166,
    }
    assert all(levels[h]["ex"] == 1.0 and levels[h]["em"] == 1.0 for h in levels)


def test_ex_all_counts_the_absent_database_as_wrong(
    gold_vs_gold, spider_dir, dev_gold, tmp_path, capsys
):
    """Published Spider numbers are over all 1,034 dev questions: ex_all counts the 62 wta_1
    questions (database absent here) as wrong, overall and per hardness; ex does not."""
    report = gold_vs_gold
    assert report["ex"] == 1.0
    assert report["ex_all"] == pytest.approx(972 / 1034, abs=1e-6)
    for level, m in report["by_hardness"].items():
        assert m["ex_all"] == pytest.approx(m["n"] / (m["n"] + m["skipped"]), abs=1e-6), level
    assert any(m["ex_all"] < 1.0 for m in report["by_hardness"].values())

    gold = [g for g in dev_gold if g[1] == "concert_singer"][:3] + [
        g for g in dev_gold if g[1] == "wta_1"
    ][:1]
    (tmp_path / "gold.sql").write_text("".join(f"{sql}\t{db}\n" for sql, db in gold))
    (tmp_path / "pred.sql").write_text("".join(f"{sql}\n" for sql, _ in gold))
    assert (
        main(
            [
                "--gold",
                str(tmp_path / "gold.sql"),
                "--pred",
                str(tmp_path / "pred.sql"),
                "--db",
                str(spider_dir / "database"),
                "--table",
                str(spider_dir / "tables.json"),
                "--out",
                str(tmp_path / "report.json"),
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    written = json.loads((tmp_path / "report.json").read_text())
    assert (written["ex"], written["ex_all"], written["skipped"]) == (1.0, 0.75, 1)
    assert "EX with skipped as wrong 75.00%" in capsys.readouterr().out


def test_wrong_and_broken_predictions_are_counted(spider_dir, dev_gold):
    gold = dev_gold[:6] + [g for g in dev_gold if g[1] == "wta_1"][:1]
    preds = [sql for sql, _ in gold]
    preds[0] = "SELECT count(*) FROM singer WHERE age > 100"  # runs, wrong result
    preds[1] = "SELEC count(*) FROM singer"  # syntax error
    preds[2] = (
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
        "SELECT count(*) FROM r"
    )  # never ends
    preds[3] = ""  # nothing generated
    from sqlrl.sql.executor import ExecLimits

    report = score_predictions(
        gold,
        preds,
        spider_dir / "database",
        spider_dir / "tables.json",
        workers=1,
        limits=ExecLimits(timeout_s=0.5),
        progress=False,
    )
    statuses = [it["status"] for it in report["items"]]
    assert statuses == ["ok", "error", "timeout", "error", "ok", "ok", "skipped"]
    assert [it["ex"] for it in report["items"]] == [0, 0, 0, 0, 1, 1, None]
    assert report["n"] == 6 and report["skipped"] == 1
    assert report["ex"] == pytest.approx(2 / 6, abs=1e-6)
    assert report["errors"] == {"error": 2, "timeout": 1}
    assert "syntax error" in report["items"][1]["error"]
    assert [it["em"] for it in report["items"]] == [0, 0, 0, 0, 1, 1, None]


def write_files(tmp_path, gold_lines, pred_lines):
    gold, pred = tmp_path / "gold.sql", tmp_path / "pred.sql"
    gold.write_text("".join(line + "\n" for line in gold_lines))
    pred.write_text("".join(line + "\n" for line in pred_lines))
    return gold, pred


def test_the_command_line_writes_the_report(spider_dir, tmp_path, capsys):
    gold_lines = (spider_dir / "dev_gold.sql").read_text().splitlines()[:4]
    gold, pred = write_files(tmp_path, gold_lines, [line.split("\t")[0] for line in gold_lines])
    out = tmp_path / "out" / "report.json"
    code = main(
        [
            "--gold",
            str(gold),
            "--pred",
            str(pred),
            "--db",
            str(spider_dir / "database"),
            "--table",
            str(spider_dir / "tables.json"),
            "--out",
            str(out),
            "--workers",
            "1",
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["ex"] == 1.0 and report["n"] == 4 and len(report["items"]) == 4
    assert "EX 100.00%" in capsys.readouterr().out


def test_mismatched_line_counts_exit_2_naming_both_files(spider_dir, tmp_path):
    gold_lines = (spider_dir / "dev_gold.sql").read_text().splitlines()[:3]
    gold, pred = write_files(tmp_path, gold_lines, ["SELECT 1", "SELECT 2"])
    out = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqlrl.eval.score",
            "--gold",
            str(gold),
            "--pred",
            str(pred),
            "--db",
            str(spider_dir / "database"),
            "--table",
            str(spider_dir / "tables.json"),
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert str(gold) in result.stderr and str(pred) in result.stderr
    assert "3 gold" in result.stderr and "2 predictions" in result.stderr
    assert not out.exists()


def test_a_malformed_gold_file_exits_2(spider_dir, tmp_path):
    gold, pred = write_files(tmp_path, ["SELECT 1 without a database id"], ["SELECT 1"])
    code = main(
        [
            "--gold",
            str(gold),
            "--pred",
            str(pred),
            "--db",
            str(spider_dir / "database"),
            "--table",
            str(spider_dir / "tables.json"),
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 2


def test_trivial_gold_results_are_flagged_and_left_out_of_ex_nontrivial(
    gold_vs_gold, spider_dir, dev_gold
):
    """A question whose gold result is empty or only zeros is matched by many wrong queries."""
    report = gold_vs_gold
    trivial = [it for it in report["items"] if it["gold_trivial"]]
    assert report["n_trivial_gold"] == len(trivial) == 77  # of the 972 scored dev questions
    assert report["ex_nontrivial"] == 1.0
    flight = [
        (sql, db)
        for sql, db in dev_gold
        if db == "flight_2" and sql.startswith("SELECT count(*) FROM FLIGHTS WHERE SourceAirport")
    ][:1]
    assert flight, "dev has flight_2 counts whose answer is 0 in this database"
    wrong = "SELECT count(*) FROM flights WHERE Airline = 'no such airline'"
    one = score_predictions(
        flight,
        [wrong],
        spider_dir / "database",
        spider_dir / "tables.json",
        workers=1,
        progress=False,
    )
    assert one["ex"] == 1.0  # EX as Spider defines it: the results agree
    assert one["items"][0]["gold_trivial"] and one["n_trivial_gold"] == 1
    assert one["ex_nontrivial"] is None  # nothing telling left to score


def run_score(spider_dir, gold, pred, out, *extra):
    """The scorer as a user runs it: a process, its exit code and its stderr."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sqlrl.eval.score",
            "--gold",
            str(gold),
            "--pred",
            str(pred),
            "--db",
            str(spider_dir / "database"),
            "--table",
            str(spider_dir / "tables.json"),
            "--out",
            str(out),
            "--workers",
            "1",
            "--no-progress",
            *extra,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0c", "\x1c", "\r"])
def test_only_newlines_separate_predictions(spider_dir, tmp_path, separator):
    """str.splitlines split a prediction at U+2028 (and more) and shifted every later one."""
    gold_lines = (spider_dir / "dev_gold.sql").read_text().splitlines()[:3]
    preds = [line.split("\t")[0] for line in gold_lines]
    preds[0] = preds[0].replace(" ", separator, 1)  # inside the first prediction
    gold, pred = write_files(tmp_path, gold_lines, preds)
    out = tmp_path / "report.json"
    result = run_score(spider_dir, gold, pred, out)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["total"] == 3
    assert [it["ex"] for it in report["items"]][1:] == [1, 1]  # later lines not shifted


def test_a_predictions_file_that_is_not_utf8_exits_2_naming_it(spider_dir, tmp_path):
    gold_lines = (spider_dir / "dev_gold.sql").read_text().splitlines()[:2]
    gold, pred = write_files(tmp_path, gold_lines, ["SELECT 1", "SELECT 2"])
    pred.write_bytes(b"SELECT 'caf\xe9'\nSELECT 2\n")
    result = run_score(spider_dir, gold, pred, tmp_path / "report.json")
    assert result.returncode == 2
    assert str(pred) in result.stderr and "UTF-8" in result.stderr
    assert "Traceback" not in result.stderr
    gold.write_bytes(b"\xff\xfe" + gold.read_bytes())
    result = run_score(spider_dir, gold, pred, tmp_path / "report.json")
    assert result.returncode == 2 and str(gold) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("where", ["directory", "under a file"])
def test_an_unwritable_report_path_exits_2_naming_it(spider_dir, tmp_path, where):
    gold_lines = (spider_dir / "dev_gold.sql").read_text().splitlines()[:1]
    gold, pred = write_files(tmp_path, gold_lines, [gold_lines[0].split("\t")[0]])
    out = tmp_path if where == "directory" else pred / "report.json"
    result = run_score(spider_dir, gold, pred, out)
    assert result.returncode == 2
    assert str(out) in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "ten"])
def test_a_limit_that_is_not_a_finite_positive_number_is_refused(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "--gold",
                "g",
                "--pred",
                "p",
                "--db",
                "d",
                "--table",
                "t",
                "--out",
                "o",
                "--timeout",
                value,
            ]
        )
    assert exit_.value.code == 2
    assert "--timeout" in capsys.readouterr().err


@pytest.mark.slow  # ~20 s: every dev question of the committed run, on the real databases
def test_the_pipelines_own_predictions_are_scored_as_the_evaluate_stage_scored_them(tmp_path):
    """data/predictions/final.jsonl is read directly (gold inside, null preds, SQL with
    newlines): the committed predictions give the committed metrics/eval_final.json's dev EX
    and EM, with no converter."""
    metrics = json.loads((REPO_ROOT / "metrics" / "eval_final.json").read_text())["dev"]
    out = tmp_path / "report.json"
    predictions = REPO_ROOT / "data" / "predictions" / "final.jsonl"
    argv = ["--pred", str(predictions), "--spider", str(SPIDER_DIR), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert (report["n"], report["skipped"]) == (metrics["n"], metrics["skipped"])
    assert report["ex"] == pytest.approx(metrics["ex"], abs=5e-7)
    assert report["em"] == pytest.approx(metrics["em"], abs=5e-7)


def test_a_predictions_jsonl_with_a_gold_file_or_without_databases_is_refused(tmp_path, capsys):
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"gold": "SELECT 1", "db_id": "x", "pred": None}) + "\n")
    gold = tmp_path / "gold.sql"
    gold.write_text("SELECT 1\tx\n")
    with pytest.raises(SystemExit):
        main(["--pred", str(predictions), "--gold", str(gold), "--spider", "s"])
    assert "its rows hold the gold, drop --gold" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--pred", str(predictions)])
    assert "give --spider DIR or --bird DIR, or both --db and --table" in capsys.readouterr().err
    predictions.write_text(json.dumps({"gold": "SELECT 1", "pred": None}) + "\n")
    assert main(["--pred", str(predictions), "--spider", str(SPIDER_DIR)]) == 2
    assert f"{predictions}:1: no db_id" in capsys.readouterr().err
