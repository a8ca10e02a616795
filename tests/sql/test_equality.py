"""Result equality (test-suite semantics) and execution-match verdicts on real Spider data."""

from __future__ import annotations

import random

import pytest

from sqlrl.sql.equality import normalize_sql, order_matters, results_match
from sqlrl.sql.judge import Judge

# ----------------------------------------------------------------------------- results_match


def test_rows_are_multisets_when_order_does_not_matter():
    gold = [(1, "a"), (2, "b"), (2, "b")]
    assert results_match(gold, [(2, "b"), (1, "a"), (2, "b")], ordered=False)
    assert not results_match(gold, [(1, "a"), (2, "b")], ordered=False)
    assert not results_match(gold, [(1, "a"), (1, "a"), (2, "b")], ordered=False)


def test_row_order_counts_when_ordered():
    gold = [(1, "a"), (2, "b")]
    assert results_match(gold, [(1, "a"), (2, "b")], ordered=True)
    assert not results_match(gold, [(2, "b"), (1, "a")], ordered=True)


def test_columns_may_be_permuted():
    gold = [(1, "a", 10.5), (2, "b", 20.0)]
    swapped = [("a", 10.5, 1), ("b", 20.0, 2)]
    assert results_match(gold, swapped, ordered=False)
    assert results_match(gold, swapped, ordered=True)
    assert not results_match(gold, list(reversed(swapped)), ordered=True)


def test_a_permutation_must_keep_rows_together():
    # Each column holds the same values, but no column order rebuilds the gold rows.
    assert not results_match([(1, 2), (2, 1)], [(1, 1), (2, 2)], ordered=False)
    assert not results_match([(1, 2, 3), (3, 2, 1)], [(1, 2, 1), (3, 2, 3)], ordered=False)
    assert results_match([(1, 1), (1, 2)], [(1, 1), (2, 1)], ordered=False)


def test_empty_results_and_shape_mismatches():
    assert results_match([], [], ordered=False)
    assert not results_match([(1,)], [], ordered=False)
    assert not results_match([(1,)], [(1, 1)], ordered=False)
    assert not results_match([(1,), (2,)], [(1,)], ordered=True)


def test_values_compare_exactly_as_sqlite_returns_them():
    assert results_match([(1,)], [(1.0,)], ordered=False)  # the same number
    assert not results_match([(0.3,)], [(0.1 + 0.2,)], ordered=False)  # no tolerance
    assert not results_match([("1",)], [(1,)], ordered=False)  # text is not a number
    assert results_match([(None, 1)], [(1, None)], ordered=False)  # NULL equals NULL
    assert not results_match([(b"a",)], [("a",)], ordered=False)  # blob is not text


def test_wide_results_with_look_alike_columns_are_decided():
    """14 columns whose values look alike: the column matching must not try every one of the
    14! permutations (it did once, and never finished); the speed is in bench_reward.py."""
    rng = random.Random(0)
    rows = [tuple(rng.sample(range(14), 14)) for _ in range(300)]
    perm = list(range(14))
    rng.shuffle(perm)
    permuted = [tuple(row[j] for j in perm) for row in rows]
    assert results_match(rows, permuted, ordered=False)
    broken = permuted[:-1] + [tuple(reversed(permuted[-1]))]
    assert not results_match(rows, broken, ordered=False)
    same = [tuple(range(14))] * 50
    assert results_match(same, [tuple(reversed(range(14)))] * 50, ordered=False)


# ----------------------------------------------------------------------------- the SQL side


def test_order_matters_only_when_gold_has_order_by():
    assert order_matters("SELECT a FROM t ORDER BY a")
    assert order_matters("select a from t order\n  by a desc")
    assert order_matters("SELECT a FROM t WHERE b = (SELECT b FROM u ORDER BY c LIMIT 1)")
    assert not order_matters("SELECT a FROM t")
    assert not order_matters("SELECT 'order by' FROM t")


def test_distinct_is_removed_everywhere_unless_kept():
    sql = "SELECT DISTINCT a, count(DISTINCT b) FROM t WHERE c = 'distinct'"
    assert normalize_sql(sql) == "SELECT  a, count( b) FROM t WHERE c = 'distinct'"
    assert normalize_sql(sql, keep_distinct=True) == sql


def test_split_comparison_operators_are_joined_outside_literals():
    assert (
        normalize_sql("SELECT a FROM t WHERE b > = 3 AND c < = 4 AND d ! = 5")
        == "SELECT a FROM t WHERE b >= 3 AND c <= 4 AND d != 5"
    )
    assert normalize_sql("SELECT a FROM t WHERE b = '> ='") == "SELECT a FROM t WHERE b = '> ='"


def test_the_word_value_is_left_alone():
    sql = "SELECT value FROM t WHERE name = 'value'"
    assert normalize_sql(sql) == sql


def test_untokenizable_text_is_unchanged():
    assert normalize_sql("SELECT 'unterminated") == "SELECT 'unterminated"


# ----------------------------------------------------------------------------- on Spider


@pytest.fixture(scope="module")
def judge():
    return Judge()


def db(spider_dir, db_id: str) -> str:
    return str(spider_dir / "database" / db_id / f"{db_id}.sqlite")


SINGERS_BY_AGE = "SELECT name , country , age FROM singer ORDER BY age DESC"
CASES = [
    # (db_id, gold, prediction, match?)
    ("concert_singer", SINGERS_BY_AGE, SINGERS_BY_AGE, True),
    (
        "concert_singer",
        SINGERS_BY_AGE,
        "SELECT age, name, country FROM singer ORDER BY age DESC",
        True,
    ),
    (
        "concert_singer",
        SINGERS_BY_AGE,
        "SELECT name, country, age FROM singer ORDER BY age ASC",
        False,
    ),
    ("concert_singer", SINGERS_BY_AGE, "SELECT name, country, age FROM singer", False),
    (
        "concert_singer",
        "SELECT name FROM singer",
        "SELECT name FROM singer ORDER BY name DESC",
        True,
    ),
    ("concert_singer", "SELECT name FROM singer", "SELECT name, age FROM singer", False),
    (
        "concert_singer",
        "SELECT song_name , song_release_year FROM singer ORDER BY age LIMIT 1",
        "SELECT song_name, song_release_year FROM singer ORDER BY age LIMIT 2",
        False,
    ),
    (
        "concert_singer",
        "SELECT song_name , song_release_year FROM singer ORDER BY age LIMIT 1",
        "SELECT song_name, song_release_year FROM singer WHERE age = (SELECT min(age) FROM singer)",
        True,
    ),
    (
        "concert_singer",
        "SELECT DISTINCT country FROM singer WHERE age > 20",
        "SELECT DISTINCT country FROM singer WHERE age > 40",
        False,
    ),
    (
        "concert_singer",
        "SELECT count(*) FROM singer WHERE country = 'France'",
        "SELECT count(*) FROM singer WHERE country = 'Netherlands'",
        False,
    ),
    ("concert_singer", "SELECT count(*) FROM singer", "SELECT count(singer_id) FROM singer", True),
    ("world_1", "SELECT count(*) FROM country", "SELECT count(IndepYear) FROM country", False),
    (
        "concert_singer",
        "SELECT avg(age) FROM singer",
        "SELECT sum(age) / count(*) FROM singer",
        True,
    ),  # 222 / 6: the integer 37 equals avg's 37.0 (numbers compare by value) ...
    (
        "concert_singer",
        "SELECT avg(age) FROM singer WHERE country = 'France'",
        "SELECT sum(age) / count(*) FROM singer WHERE country = 'France'",
        False,
    ),  # ... but 138 / 4 is 34 in integer division, not 34.5
    (
        "pets_1",
        "SELECT count(DISTINCT pettype) FROM pets",
        "SELECT count(pettype) FROM pets",
        True,
    ),  # DISTINCT is removed from both queries, as the test suite does by default
    ("concert_singer", "SELECT DISTINCT country FROM singer", "SELECT country FROM singer", True),
    ("concert_singer", "SELECT count(*) FROM singer", "SELECT count(*) FROM singers", False),
]


@pytest.mark.parametrize("db_id, gold, pred, expected", CASES)
def test_execution_match_on_perturbed_queries(spider_dir, judge, db_id, gold, pred, expected):
    judgement = judge.judge(db(spider_dir, db_id), gold, pred)
    assert judgement.match is expected, judgement


def test_keep_distinct_compares_distinct_as_written(spider_dir):
    strict = Judge(keep_distinct=True)
    path = db(spider_dir, "concert_singer")
    assert not strict.judge(
        path, "SELECT DISTINCT country FROM singer", "SELECT country FROM singer"
    ).match
    assert not strict.judge(
        path, "SELECT count(DISTINCT country) FROM singer", "SELECT count(country) FROM singer"
    ).match
    assert strict.judge(
        path, "SELECT DISTINCT country FROM singer", "SELECT country FROM singer GROUP BY country"
    ).match


def test_judgement_statuses(spider_dir, judge):
    path = db(spider_dir, "concert_singer")
    assert judge.judge(path, "SELECT 1", "SELEC 1").status == "error"
    assert judge.judge(path, "SELECT nothing FROM nowhere", "SELECT 1").status == "error"
    absent = judge.judge(db(spider_dir, "wta_1"), "SELECT count(*) FROM players", "SELECT 1")
    assert absent.status == "skipped" and not absent.match
