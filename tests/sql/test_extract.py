"""extract_sql on the shapes models really produce, and on text that is not SQL at all."""

from __future__ import annotations

import pytest

from sqlrl.sql.extract import completion_text, extract_sql

QUERY = "SELECT name FROM singer WHERE age > 20"


@pytest.mark.parametrize(
    "text, expected",
    [
        (QUERY, QUERY),
        (QUERY + ";", QUERY),
        (QUERY + " ;\n", QUERY),
        ("  \n" + QUERY + "\n\n", QUERY),
        ("```sql\n" + QUERY + ";\n```", QUERY),
        ("```sqlite\n" + QUERY + "\n```", QUERY),
        ("```SQL\n" + QUERY + "\n```", QUERY),
        ("```\n" + QUERY + "\n```", QUERY),
        ("```sql " + QUERY + "```", QUERY),
        ("SQL: " + QUERY, QUERY),
        ("SQL:\n" + QUERY + ";", QUERY),
        ("SQLite query: " + QUERY, QUERY),
        ("Answer: " + QUERY, QUERY),
        ("sql\n" + QUERY, QUERY),
        ("The query is `" + QUERY + "`.", QUERY),
        (
            "Here is the SQL query:\n\n```sql\n"
            + QUERY
            + "\n```\n\nExplanation:\n- `singer` is the "
            "table.\n- We filter with `WHERE`.",
            QUERY,
        ),
        ("To select the names, use " + QUERY + "; It returns the names of older singers.", QUERY),
        (
            "Here's the query:\n\nSELECT name\nFROM singer\nWHERE age > 20;\n\nThis query returns "
            "the names.",
            "SELECT name\nFROM singer\nWHERE age > 20",
        ),
        (
            "SELECT name\nFROM singer\n\nWHERE age > 20",
            "SELECT name\nFROM singer\n\nWHERE age > 20",
        ),
        (QUERY + "\nThe above query lists the names.", QUERY),
        ("<think>I should select names from singer.</think>\n```sql\n" + QUERY + "\n```", QUERY),
        ("Draft:\n```sql\nSELECT 1;\n```\nBetter:\n```sql\n" + QUERY + ";\n```", QUERY),
        ("```python\nprint(1)\n```\n```sql\n" + QUERY + "\n```", QUERY),
        ("```sql\n" + QUERY, QUERY),  # truncated generation: the fence never closes
        ("With the singer table we get:\nSELECT name FROM singer", "SELECT name FROM singer"),
        (
            "Use a CTE: WITH old AS (SELECT * FROM singer WHERE age > 40) SELECT name FROM old;",
            "WITH old AS (SELECT * FROM singer WHERE age > 40) SELECT name FROM old",
        ),
        (
            "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 3) "
            "SELECT i FROM r",
            "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r "
            "WHERE i < 3) SELECT i FROM r",
        ),
    ],
)
def test_extracts_the_query(text, expected):
    assert extract_sql(text) == expected


def test_keeps_semicolons_inside_string_literals():
    sql = "SELECT name FROM singer WHERE name = 'a;b'"
    assert extract_sql("Query: " + sql + "; Done.") == sql
    assert extract_sql("```sql\n" + sql + ";\n```") == sql


def test_keeps_stacked_statements_together_so_that_execution_rejects_them():
    assert extract_sql("SELECT 1; DROP TABLE singer") == "SELECT 1; DROP TABLE singer"
    assert (
        extract_sql("```sql\nSELECT 1;\nDELETE FROM singer;\n```")
        == "SELECT 1;\nDELETE FROM singer"
    )


def test_passes_non_queries_through_for_the_executor_to_judge():
    assert extract_sql("DELETE FROM singer;") == "DELETE FROM singer"
    assert extract_sql("ATTACH 'x.db' AS x") == "ATTACH 'x.db' AS x"
    assert extract_sql("I don't know.") == "I don't know."


@pytest.mark.parametrize("text", ["", "   \n", None, 42, ["not a message"], {}])
def test_empty_or_unusable_input_gives_empty_sql(text):
    assert extract_sql(text) == ""


def test_chat_messages_use_the_last_assistant_message():
    messages = [
        {"role": "user", "content": "How many singers?"},
        {"role": "assistant", "content": "```sql\nSELECT 1\n```"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "```sql\nSELECT count(*) FROM singer;\n```"},
    ]
    assert extract_sql(messages) == "SELECT count(*) FROM singer"
    assert (
        extract_sql([{"role": "assistant", "content": [{"type": "text", "text": "SQL: SELECT 2"}]}])
        == "SELECT 2"
    )
    assert completion_text([{"role": "user", "content": "only a user turn"}]) == "only a user turn"


# Megabytes of one token repeated, as a runaway generation writes them: the SQL taken from
# each, or None where only a piece of the text is expected
MEGABYTES = {
    "semicolons": (";" * 1_000_000, ""),
    "blank lines": ("\n\n" * 500_000, ""),
    "spaces": (" " * 1_000_000 + "x", "x"),
    "select": ("select " * 200_000, ("select " * 200_000).strip()),  # unwrapped: as it is
    "stacked": ("SELECT 1;" * 200_000, ("SELECT 1;" * 200_000).rstrip(";")),  # kept together
    "fences": ("```" * 300_000, None),
    "labels": ("sql:" * 200_000, None),
}


@pytest.mark.parametrize("name", MEGABYTES)
def test_megabyte_inputs_are_cut_at_a_bounded_number_of_places(name, monkeypatch):
    """A cut at a `;` asks SQLite whether the statement before it is complete, which reads all
    of it: asked at every `;` of a megabyte, extraction is quadratic. It is asked at a bounded
    number of them (timings: benchmarks/bench_extract.py)."""
    import sqlrl.sql.extract

    text, expected = MEGABYTES[name]
    asked = 0
    complete = sqlrl.sql.extract._complete

    def counted(sql: str) -> bool:
        nonlocal asked
        asked += 1
        assert asked <= sqlrl.sql.extract._MAX_SEMICOLONS, "asked at every semicolon"
        return complete(sql)

    monkeypatch.setattr(sqlrl.sql.extract, "_complete", counted)
    sql = extract_sql(text)
    assert sql in text if expected is None else sql == expected


ODD = ["\x00", "\ud800", "\udcff", "\x00\ud800", "\x1b", "\ufeff", "\u2028"]


@pytest.mark.parametrize("odd", ODD)
@pytest.mark.parametrize(
    "shape",
    [
        "SELECT 1{odd};",
        "SELECT 1{odd}; and some prose",
        "SELECT '{odd}'; SELECT 2",
        "```sql\nSELECT 1{odd};\n```",
        "{odd}SELECT 1; -- done{odd}",
        "SQL: SELECT 1;{odd} ok then",
        "The answer is SELECT name FROM singer{odd}; hope it helps",
        "{odd};{odd};{odd}",
    ],
)
def test_any_string_is_taken_without_raising(shape, odd):
    """NULs and lone surrogates (surrogateescape-decoded text) made complete_statement raise."""
    sql = extract_sql(shape.format(odd=odd))
    assert "SELECT" in sql or not sql.strip("; " + odd)
