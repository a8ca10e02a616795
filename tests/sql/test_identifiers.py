"""Names a query writes that its database lacks (sqlrl/sql/identifiers.py), on concert_singer's
real schema, and the gold queries of Spider dev, which must name none."""

from __future__ import annotations

import json

import pytest

from sqlrl.data.spider import load_schemas
from sqlrl.sql.identifiers import absent_identifier_stats, absent_names


@pytest.fixture(scope="module")
def schemas(spider_dir):
    return load_schemas(spider_dir / "tables.json")


@pytest.mark.parametrize(
    "sql, absent",
    [
        ("SELECT count(*) FROM singer", []),
        ("select NAME from SINGER where AGE > 20", []),  # SQLite compares names case-blind
        ("SELECT count(*) FROM singers", ["singers"]),
        ("SELECT nope FROM singer", ["nope"]),
        ("SELECT T1.Name FROM singer AS T1 JOIN pets AS T2 ON T1.x = T2.y", ["pets", "x", "y"]),
        # result-column aliases, subquery column aliases, CTE names and their columns: declared
        ("SELECT count(*) AS cnt FROM singer GROUP BY Country ORDER BY cnt", []),
        ("SELECT T.num FROM (SELECT count(*) AS num FROM concert) AS T", []),
        ("WITH c(n) AS (SELECT Name FROM stadium) SELECT n FROM c", []),
        ("WITH big AS (SELECT * FROM stadium) SELECT Capacity FROM big", []),
        # a double-quoted unknown name is a string to SQLite; a known one is the column
        ('SELECT Name FROM singer WHERE Country = "France"', []),
        ('SELECT "Name" FROM singer', []),
        ("SELECT T1.* FROM singer AS T1", []),
        # each absent name once, tables first
        ("SELECT a, a, b FROM t, t", ["t", "a", "b"]),
    ],
)
def test_absent_names(schemas, sql, absent):
    assert absent_names(sql, schemas["concert_singer"]) == absent


@pytest.mark.parametrize(
    "sql", ["", "   ", "SELECT FROM WHERE (", "I do not know.", "no sql", "SELECT 1; SELECT 2"]
)
def test_what_does_not_parse_names_nothing_checkable(schemas, sql):
    assert absent_names(sql, schemas["concert_singer"]) is None


def test_no_gold_query_of_spider_dev_names_an_absent_identifier(schemas, spider_dir):
    """The rule against the reference: every gold query runs on its database, so a name it
    flags would be a false alarm (each dev query parses with sqlglot, too)."""
    dev = json.loads((spider_dir / "dev.json").read_text())
    flagged = {
        i: names
        for i, item in enumerate(dev)
        if (names := absent_names(item["query"], schemas[item["db_id"]]))
    }
    assert not flagged
    assert all(absent_names(item["query"], schemas[item["db_id"]]) is not None for item in dev)


def test_stats_over_answers(schemas):
    concert = schemas["concert_singer"]
    stats = absent_identifier_stats(
        ["SELECT count(*) FROM singer", "SELECT x FROM singer", "no sql", "SELECT y FROM z"],
        [concert, concert, concert, None],  # the last has no known schema: not counted
    )
    assert stats == {
        "absent_identifier_share": round(1 / 3, 4),
        "absent_identifier_rows": 1,
        "unparsed_share": round(1 / 3, 4),
    }
    empty = {"absent_identifier_share": None, "absent_identifier_rows": 0, "unparsed_share": None}
    assert absent_identifier_stats([], []) == empty
