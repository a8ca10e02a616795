"""Schema repair (sqlrl/sql/schema_repair.py) on real Spider schemas and databases."""

from __future__ import annotations

import pytest

from sqlrl.data.spider import database_path, load_schemas
from sqlrl.eval.evaluate import evaluate_split
from sqlrl.sql.executor import SQLExecutor
from sqlrl.sql.schema_repair import repair_sql


@pytest.fixture(scope="module")
def schemas(spider_dir):
    return load_schemas(spider_dir / "tables.json")


@pytest.fixture(scope="module")
def run(spider_dir):
    executor = SQLExecutor()
    return lambda db_id, sql: executor.execute(database_path(spider_dir, db_id), sql)


def test_a_memorised_table_name_becomes_the_one_the_question_mentions(schemas, run):
    sql = "SELECT count(*) FROM performance"  # a table of another database
    assert run("concert_singer", sql).status == "error"
    fixed = repair_sql(sql, schemas["concert_singer"], "How many singers do we have?")
    assert fixed == "SELECT COUNT(*) FROM singer"
    assert (
        run("concert_singer", fixed).rows
        == run("concert_singer", "SELECT count(*) FROM singer").rows
    )


def test_unknown_columns_map_onto_the_tables_of_the_query(schemas, run):
    sql = (
        "SELECT T1.name FROM singer AS T1 JOIN singer_in_concert AS T2 "
        "ON T1.singer_id = T2.singer_idx WHERE T1.ages > 30"
    )
    fixed = repair_sql(sql, schemas["concert_singer"], "Names of singers older than 30?")
    assert "T2.Singer_ID" in fixed and "T1.Age > 30" in fixed
    assert run("concert_singer", fixed).status == "ok"


def test_a_query_whose_names_all_exist_is_returned_unchanged(schemas):
    sql = 'select name , "Country" from SINGER where country = "France" order by age desc'
    assert repair_sql(sql, schemas["concert_singer"], "Singers from France?") == sql


@pytest.mark.parametrize(
    "sql",
    [
        # SQLite reads an unknown double-quoted name as a string: a value, not a column
        'SELECT name FROM singer WHERE country = "Netherlands"',
        # column aliases, CTE names and subquery columns are the query's own names
        "SELECT country, count(*) AS n FROM singer GROUP BY country ORDER BY n DESC",
        "WITH old AS (SELECT name FROM singer WHERE age > 40) SELECT name FROM old",
        "SELECT s.total FROM (SELECT count(*) AS total FROM singer) AS s",
        "this is not SQL at all (",
        "",
    ],
)
def test_names_the_query_defines_itself_and_unparsable_text_are_left_alone(schemas, sql):
    assert repair_sql(sql, schemas["concert_singer"], "Which singers?") == sql


def test_two_unknown_tables_do_not_collapse_onto_one(schemas):
    sql = "SELECT T1.x FROM teams AS T1 JOIN arenas AS T2 ON T1.id = T2.id"
    fixed = repair_sql(sql, schemas["concert_singer"], "Which singers performed in which concert?")
    assert "FROM singer AS T1 JOIN concert AS T2" in fixed


def test_evaluation_scores_the_repaired_query_and_keeps_the_model_s_own(spider_dir):
    rows = [
        {
            "question": "How many singers do we have?",
            "db_id": "concert_singer",
            "gold": "SELECT count(*) FROM singer",
            "db_present": True,
            "db_path": "data/raw/spider/database/concert_singer/concert_singer.sqlite",
            "prompt": [{"role": "user", "content": "q0"}],
        },
        {
            "question": "What are the names of the stadiums?",
            "db_id": "concert_singer",
            "gold": "SELECT name FROM stadium",
            "db_present": True,
            "db_path": "data/raw/spider/database/concert_singer/concert_singer.sqlite",
            "prompt": [{"role": "user", "content": "q1"}],
        },
    ]

    class Model:
        def generate(self, prompts):
            return (
                {"q0": ["SELECT count(*) FROM performance"], "q1": ["SELECT name FROM stadium"]}[
                    prompts[0]
                ]
                if len(prompts) == 1
                else ["SELECT count(*) FROM performance", "SELECT name FROM stadium"]
            )

    render = lambda messages: messages[-1]["content"]  # noqa: E731
    tables = spider_dir / "tables.json"
    plain, _ = evaluate_split(rows, Model(), render, tables_json=tables, workers=1)
    metrics, preds = evaluate_split(
        rows, Model(), render, tables_json=tables, workers=1, schema_repair=True
    )
    assert plain["ex"] == 0.5 and "repaired" not in plain
    assert metrics["ex"] == 1.0 and metrics["repaired"] == 1
    assert preds[0]["pred"] == "SELECT COUNT(*) FROM singer"
    assert preds[0]["before_repair"] == "SELECT count(*) FROM performance"
    assert "before_repair" not in preds[1]
