"""Conformance of sqlrl.eval.spider_eval with Spider's official evaluation.py / process_sql.py.

Oracles, strongest first:
* dev.json carries the official parser's output (`sql`) for every gold query: our parse
  must reproduce it field for field, and hardness computed from it (by an independent,
  test-only transcription of the official counting rules) must equal ours;
* gold against itself must be an exact match;
* systematic perturbations of every dev gold, each with the verdict the official rules
  give (the rule is cited next to each perturbation);
* hand-written cases for the quirks of the official reader.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from sqlrl.eval.spider_eval import SpiderParseError, exact_match, hardness, parse_sql
from sqlrl.eval.spider_eval.schema import schema_index


@pytest.fixture(scope="module")
def schemas(spider_dir):
    return {entry["db_id"]: entry for entry in json.loads((spider_dir / "tables.json").read_text())}


@pytest.fixture(scope="module")
def dev(spider_dir):
    return json.loads((spider_dir / "dev.json").read_text())


# ---- oracle 1: the official structure stored in dev.json --------------------------------
def _as_official_ids(node, index):
    """Our string ids -> the integer ids dev.json uses; tuples -> lists; any LIMIT -> 1."""
    if isinstance(node, dict):
        return {
            k: (1 if k == "limit" and v is not None else _as_official_ids(v, index))
            for k, v in node.items()
        }
    if isinstance(node, (list, tuple)):
        return [_as_official_ids(v, index) for v in node]
    if isinstance(node, str):
        return index.column_index.get(node, index.table_index.get(node, node))
    return node


def _limit_as_presence(node):
    if isinstance(node, dict):
        return {
            k: (1 if k == "limit" and v is not None else _limit_as_presence(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_limit_as_presence(v) for v in node]
    return node


def test_parse_reproduces_the_official_structure_on_all_of_dev(dev, schemas):
    mismatches = []
    for i, ex in enumerate(dev):
        schema = schemas[ex["db_id"]]
        try:
            ours = _as_official_ids(parse_sql(ex["query"], schema), schema_index(schema))
        except SpiderParseError as err:
            mismatches.append((i, str(err)))
            continue
        if ours != _limit_as_presence(ex["sql"]):
            mismatches.append((i, ex["query"]))
    rate = 1 - len(mismatches) / len(dev)
    print(f"\nstructure agreement with dev.json `sql`: {rate:.4%} ({len(mismatches)} differ)")
    assert rate == 1.0, mismatches[:10]


# ---- oracle 2: hardness from the official structure -------------------------------------
def _official_hardness(sql: dict) -> str:
    """Test-only transcription of evaluation.py's eval_hardness over a dev.json `sql` dict."""

    def agg_count(units):  # has_agg(unit) is `unit[0] != 0`, on anything
        return len([u for u in units if u[0] != 0])

    conds = sql["from"]["conds"], sql["where"], sql["having"]
    connectors = [w for c in conds for w in c[1::2]]
    units = [u for c in conds for u in c[::2]]
    comp1 = (
        bool(sql["where"])
        + bool(sql["groupBy"])
        + bool(sql["orderBy"])
        + (sql["limit"] is not None)
        + max(len(sql["from"]["table_units"]) - 1, 0)
        + connectors.count("or")
        + len([u for u in units if u[1] == 9])
    )
    comp2 = len([v for u in units for v in (u[3], u[4]) if isinstance(v, dict)]) + sum(
        sql[k] is not None for k in ("intersect", "except", "union")
    )
    aggs = agg_count(sql["select"][1]) + agg_count(sql["where"][::2]) + agg_count(sql["groupBy"])
    if sql["orderBy"]:
        aggs += agg_count(
            [vu[1] for vu in sql["orderBy"][1] if vu[1]]
            + [vu[2] for vu in sql["orderBy"][1] if vu[2]]
        )
    aggs += agg_count(sql["having"])
    others = (
        (aggs > 1)
        + (len(sql["select"][1]) > 1)
        + (len(sql["where"]) > 1)
        + (len(sql["groupBy"]) > 1)
    )
    if comp1 <= 1 and others == 0 and comp2 == 0:
        return "easy"
    if (others <= 2 and comp1 <= 1 and comp2 == 0) or (comp1 <= 2 and others < 2 and comp2 == 0):
        return "medium"
    if (
        (others > 2 and comp1 <= 2 and comp2 == 0)
        or (2 < comp1 <= 3 and others <= 2 and comp2 == 0)
        or (comp1 <= 1 and others == 0 and comp2 <= 1)
    ):
        return "hard"
    return "extra"


def test_hardness_agrees_with_the_official_rules_on_all_of_dev(dev, schemas):
    ours = [hardness(ex["query"], schemas[ex["db_id"]]) for ex in dev]
    official = [_official_hardness(ex["sql"]) for ex in dev]
    disagreements = [
        (i, o, t) for i, (o, t) in enumerate(zip(ours, official, strict=False)) if o != t
    ]
    rate = 1 - len(disagreements) / len(dev)
    print(f"\nhardness agreement: {rate:.4%}; levels {Counter(ours)}")
    assert rate >= 0.99, disagreements[:10]
    assert not disagreements, disagreements[:10]
    # the published Spider dev split: 248 easy, 446 medium, 174 hard, 166 extra
    assert Counter(ours) == {"easy": 248, "medium": 446, "hard": 174, "extra": 166}


def test_gold_against_itself_is_an_exact_match_on_all_of_dev(dev, schemas):
    misses = [
        ex["query"] for ex in dev if not exact_match(ex["query"], ex["query"], schemas[ex["db_id"]])
    ]
    assert misses == []


# ---- oracle 3: perturbations with the official verdict ----------------------------------
_STRING = re.compile(r"'[^']*'|\"[^\"]*\"")
_HOLE = re.compile(r"__Q(\d+)__", re.I)


def _mask(sql: str) -> tuple[str, list[str]]:
    """String literals -> __Qn__ so text edits never touch them."""
    found: list[str] = []

    def keep(m):
        found.append(m.group())
        return f"__Q{len(found) - 1}__"

    return _STRING.sub(keep, sql), found


def _unmask(text: str, found: list[str]) -> str:
    return _HOLE.sub(lambda m: found[int(m.group(1))], text)


def _edit(fn):
    """Lift an edit of the masked text to the SQL; None (not applicable) when unchanged."""

    def run(sql, schema):
        text, found = _mask(sql)
        out = fn(text, schema)
        return None if out is None or out == text else _unmask(out, found)

    run.__name__ = fn.__name__
    return run


def _single_select(text: str) -> bool:
    return len(re.findall(r"\bselect\b", text, re.I)) == 1


def _top_commas(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return parts + [text[start:].strip()]


@_edit
def reformat(text, _):
    """Lower-case, one line, single spaces: the official reader lower-cases and re-tokenizes."""
    return re.sub(r"\s+", " ", text.lower()).strip() + " ;"


@_edit
def reformat_upper(text, _):
    return re.sub(r"\s+(FROM|WHERE|GROUP|ORDER|LIMIT)\b", r"\n  \1", text.upper())


@_edit
def rename_aliases(text, _):
    """Aliases are resolved to tables (scan_alias), so their names do not matter."""
    return re.sub(r"\bT(\d+)\b", r"alias_\1", text, flags=re.I)


@_edit
def reorder_select(text, _):
    """eval_sel matches select units as a multiset."""
    m = re.match(r"(\s*select\s+(?:distinct\s+)?)(.*?)(\s+from\s.*)", text, re.I | re.S)
    if not _single_select(text) or m is None or len(items := _top_commas(m.group(2))) < 2:
        return None
    return m.group(1) + " , ".join(reversed(items)) + m.group(3)


@_edit
def reorder_and(text, _):
    """eval_where matches condition units as a multiset; and/or compares the set of connectors."""
    m = re.search(r"(\bwhere\s+)(.*?)(\s+(?:group|order|limit)\b.*|\s*;?\s*$)", text, re.I | re.S)
    if not _single_select(text) or m is None or re.search(r"\b(or|between)\b", m.group(2), re.I):
        return None
    conds = re.split(r"\s+and\s+", m.group(2), flags=re.I)
    if len(conds) < 2:
        return None
    return text[: m.start(2)] + " AND ".join(reversed(conds)) + m.group(3)


def change_values(sql, _):
    """rebuild_sql_val drops every condition value (not LIMIT, which only counts as present)."""
    text, found = _mask(sql)
    out = re.sub(
        r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])",
        lambda m: m.group() if re.search(r"limit\s*$", text[: m.start()], re.I) else "12345",
        text,
    )
    out = _HOLE.sub("'zzz changed'", out)
    return None if out == text else out


def _from_subquery_has_values(sql, _):
    """Values inside a FROM subquery survive (rebuild_sql_val skips table units)."""
    text, _found = _mask(sql)
    m = re.search(r"\bfrom\s*\(", text, re.I)
    if m is None:
        return False
    depth, i = 1, m.end()
    while depth and i < len(text):
        depth += (text[i] == "(") - (text[i] == ")")
        i += 1
    inner = text[m.end() : i]
    return bool(_HOLE.search(inner) or re.search(r"(?<!limit )(?<![\w.])\d+(?![\w.])", inner, re.I))


@_edit
def swap_aggregate(text, _):
    """(agg_id, val_unit) differs, and every clause holding an aggregate is compared."""
    swap = {"max": "min", "min": "max", "avg": "sum", "sum": "avg"}
    return re.sub(
        r"\b(max|min|avg|sum)(?=\s*\()",
        lambda m: swap[m.group(1).lower()],
        text,
        count=1,
        flags=re.I,
    )


@_edit
def flip_order(text, _):
    """orderBy is compared with its direction: ('desc', ...) != ('asc', ...)."""
    starts = [m.end() for m in re.finditer(r"\border\s+by\b", text, re.I)]
    if not starts or ")" in text[starts[-1] :]:
        return None
    head, tail = text[: starts[-1]], text[starts[-1] :]
    last = list(re.finditer(r"\b(asc|desc)\b", tail, re.I))
    if last:
        m = last[-1]
        return (
            head
            + tail[: m.start()]
            + ("ASC" if m.group().lower() == "desc" else "DESC")
            + tail[m.end() :]
        )
    m = re.search(r"\s+limit\b|\s*;?\s*$", tail, re.I)
    return head + tail[: m.start()] + " DESC" + tail[m.start() :]


@_edit
def change_limit(text, _):
    """Only LIMIT's presence is compared (eval_order, keywords); values are not."""
    return re.sub(
        r"\b(limit\s+)(\d+)", lambda m: m.group(1) + str(int(m.group(2)) + 4), text, flags=re.I
    )


@_edit
def remove_limit(text, _):
    """'limit' is a keyword of get_keywords, so dropping it changes the keyword set."""
    hits = list(re.finditer(r"\s+limit\s+\d+", text, re.I))
    return text[: hits[-1].start()] + text[hits[-1].end() :] if hits else None


@_edit
def add_distinct(text, _):
    """DISABLE_DISTINCT: rebuild_select_col clears the SELECT flag before comparing."""
    if re.match(r"\s*select\s+distinct\b", text, re.I):
        return None
    return re.sub(r"^\s*select\b", "SELECT DISTINCT", text, count=1, flags=re.I)


@_edit
def add_distinct_in_where_subquery(text, _):
    """rebuild_cond_unit_col never enters a nested query, so its DISTINCT flag is compared."""
    return re.sub(
        r"((?:\bin|=|>|<)\s*\(\s*select\s+)(?!distinct\b)",
        r"\1DISTINCT ",
        text,
        count=1,
        flags=re.I,
    )


def count_star_to_column(sql, schema):
    """count(*) is col '__all__'; count(col) names a column: the select units differ."""
    text, found = _mask(sql)
    m = re.search(r"\bfrom\s+(\w+)(?:\s+as\s+(\w+))?", text, re.I)
    star = re.search(r"\bcount\s*\(\s*\*\s*\)", text, re.I)
    if m is None or star is None:
        return None
    table = m.group(1).lower()
    t_idx = [t.lower() for t in schema["table_names_original"]].index(table)
    column = next(c for t, c in schema["column_names_original"] if t == t_idx)
    qualified = f"{m.group(2)}.{column}" if m.group(2) else column
    return _unmask(text[: star.start()] + f"count({qualified})" + text[star.end() :], found)


def truncate(sql, _):
    """The first half of the tokens: unreadable, or a query missing whole components."""
    toks = sql.split()
    return " ".join(toks[: len(toks) // 2]) if len(toks) >= 4 else None


@_edit
def implicit_alias(text, _):
    """process_sql only knows `AS` aliases; `FROM singer T1` stops parse_from (score 0)."""
    return re.sub(r"\bAS\s+(T\d+)\b", r"\1", text, flags=re.I)


@_edit
def neq_as_ltgt(text, _):
    """NLTK splits `<>` into `<` `>`, and `>` is no value: unreadable (score 0)."""
    return text.replace("!=", "<>")


@_edit
def glued_equals(text, _):
    """NLTK does not split on `=`, so `a=b` is one unreadable token (score 0)."""
    return re.sub(r"(?<![<>!])\s+=\s+", "=", text, count=1)


@_edit
def select_alias(text, _):
    """parse_select reads `AS` as a column and fails (score 0)."""
    m = re.match(r"(\s*select\s+(?:distinct\s+)?)(.*?)(\s+from\s.*)", text, re.I | re.S)
    if not _single_select(text) or m is None:
        return None
    items = _top_commas(m.group(2))
    return m.group(1) + " , ".join([items[0] + " AS my_alias"] + items[1:]) + m.group(3)


@_edit
def left_join_first(text, _):
    """After a table unit, parse_table_unit('left') fails (score 0)."""
    return re.sub(r"\bJOIN\b", "LEFT JOIN", text, count=1, flags=re.I)


@_edit
def inner_join_after_on(text, _):
    """After `ON x = T2.col` the value scan swallows INNER up to JOIN: still a plain join (score 1)."""
    joins = list(re.finditer(r"\bJOIN\b", text, re.I))
    if len(joins) < 2 or not re.search(r"\b[A-Za-z_]\w*\.\w+\s+$", text[: joins[1].start()]):
        return None
    return text[: joins[1].start()] + "INNER JOIN" + text[joins[1].end() :]


def foreign_key_swap(sql, schema):
    """A FROM-table column in a foreign-key group is folded to its representative (score 1)."""
    text, found = _mask(sql)
    if not _single_select(text):
        return None
    index = schema_index(schema)
    aliases = {
        a.lower(): t.lower()
        for t, a in re.findall(r"\b(?:from|join)\s+(\w+)\s+as\s+(\w+)", text, re.I)
    }
    sel = re.match(r"(\s*select\s+(?:distinct\s+)?)(.*?)(\s+from\s.*)", text, re.I | re.S)
    for a1, c1, a2, c2 in re.findall(r"\bon\s+(\w+)\.(\w+)\s*=\s*(\w+)\.(\w+)", text, re.I):
        ids = [
            index.qualified(aliases.get(a.lower(), ""), c.lower()) for a, c in ((a1, c1), (a2, c2))
        ]
        if None in ids or index.fk_map.get(ids[0], ids[0]) != index.fk_map.get(ids[1], ids[1]):
            continue
        for old, new in ((f"{a1}.{c1}", f"{a2}.{c2}"), (f"{a2}.{c2}", f"{a1}.{c1}")):
            pattern = re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w.])", re.I)
            if pattern.search(sel.group(2)):
                return _unmask(
                    sel.group(1) + pattern.sub(new, sel.group(2), count=1) + sel.group(3), found
                )
    return None


# kind -> (perturbation, expected official verdict (bool, or a function of gold and schema),
#          the least number of dev golds it must apply to)
PERTURBATIONS = {
    "reformat": (reformat, True, 1000),
    "reformat_upper": (reformat_upper, True, 1000),
    "rename_aliases": (rename_aliases, True, 400),
    "reorder_select": (reorder_select, True, 300),
    "reorder_and": (reorder_and, True, 30),
    "change_values": (
        change_values,
        lambda sql, schema: not _from_subquery_has_values(sql, schema),
        450,
    ),
    "swap_aggregate": (swap_aggregate, False, 130),
    "flip_order": (flip_order, False, 110),
    "change_limit": (change_limit, True, 170),
    "remove_limit": (remove_limit, False, 170),
    "add_distinct": (add_distinct, True, 900),
    "add_distinct_in_where_subquery": (add_distinct_in_where_subquery, False, 70),
    "count_star_to_column": (count_star_to_column, False, 330),
    "truncate": (truncate, False, 1000),
    "implicit_alias": (implicit_alias, False, 400),
    "neq_as_ltgt": (neq_as_ltgt, False, 20),
    "glued_equals": (glued_equals, False, 500),
    "select_alias": (select_alias, False, 800),
    "left_join_first": (left_join_first, False, 400),
    "inner_join_after_on": (inner_join_after_on, True, 50),
    "foreign_key_swap": (foreign_key_swap, True, 55),
}


@pytest.mark.parametrize("kind", sorted(PERTURBATIONS))
def test_perturbation_gets_the_official_verdict(kind, dev, schemas):
    perturb, expected, least = PERTURBATIONS[kind]
    applied, wrong = 0, []
    for ex in dev:
        schema = schemas[ex["db_id"]]
        pred = perturb(ex["query"], schema)
        if pred is None:
            continue
        applied += 1
        want = expected(ex["query"], schema) if callable(expected) else expected
        if exact_match(ex["query"], pred, schema) != want:
            wrong.append((ex["query"], pred, want))
    print(f"\n{kind}: {applied} applied, {applied - len(wrong)} agree")
    assert applied >= least
    assert wrong == []


# ---- quirks of the official reader and evaluator ----------------------------------------
CONCERT = "concert_singer"


@pytest.mark.parametrize(
    "readable, unreadable",
    [
        ("SELECT T1.name FROM singer AS T1", "SELECT T1.name FROM singer T1"),
        ("SELECT count(*) FROM singer", "SELECT count(*) AS n FROM singer"),
        ("SELECT name FROM singer WHERE age != 30", "SELECT name FROM singer WHERE age <> 30"),
        (
            "SELECT name FROM singer WHERE country = 'France'",
            "SELECT name FROM singer WHERE country='France'",
        ),
        ("SELECT name FROM singer WHERE age >= 30", "SELECT name FROM singer WHERE age >=30"),
        (
            "SELECT name FROM singer WHERE song_name LIKE '%a%'",
            "SELECT name FROM singer WHERE song_name LIKE'%a%'",
        ),
        (
            "SELECT name FROM singer WHERE country != 'France'",
            "SELECT name FROM singer WHERE NOT country = 'France'",
        ),
        (
            "SELECT name FROM singer WHERE song_name = 'x'",
            "SELECT name FROM singer WHERE song_name IS NOT NULL",
        ),
        (
            "SELECT name FROM singer WHERE age IN (SELECT age FROM singer)",
            "SELECT name FROM singer WHERE age IN (30, 40)",
        ),
        (
            "SELECT T1.name FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.singer_id = T2.singer_id",
            "SELECT T1.name FROM singer AS T1 LEFT JOIN singer_in_concert AS T2 ON T1.singer_id = T2.singer_id",
        ),
        (
            "SELECT T1.name FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.singer_id = T2.singer_id",
            "SELECT T1.name FROM singer AS T1 , singer_in_concert AS T2 WHERE T1.singer_id = T2.singer_id",
        ),
        (
            "SELECT name FROM singer WHERE age > 30 UNION SELECT name FROM singer WHERE age < 20",
            "SELECT name FROM singer WHERE age > 30 UNION ALL SELECT name FROM singer WHERE age < 20",
        ),
        (
            "SELECT name FROM singer WHERE age > 30 OR age < 20",
            "SELECT name FROM singer WHERE (age > 30 OR age < 20)",
        ),
        ("SELECT name FROM singer", "SELECT `name` FROM singer"),
        ("SELECT name FROM singer", "SELECT name FROM singer -- the names"),
        (
            "SELECT name FROM singer WHERE country = 'France'",
            'SELECT name FROM singer WHERE country = "Fran\'ce"',
        ),
        ("SELECT avg(age) FROM singer", "SELECT avg(CAST(age AS REAL)) FROM singer"),
        ("SELECT name FROM singer ORDER BY age DESC", "SELECT name FROM singer ORDER BY 1 DESC"),
    ],
)
def test_prediction_unreadable_by_the_official_reader_scores_zero(readable, unreadable, schemas):
    schema = schemas[CONCERT]
    assert exact_match(readable, readable, schema)
    assert exact_match(readable, unreadable, schema) is False
    with pytest.raises(SpiderParseError):
        parse_sql(unreadable, schema)


@pytest.mark.parametrize(
    "gold, pred, verdict",
    [
        # count(*) is column __all__, count(col) a real column
        ("SELECT count(*) FROM singer", "SELECT count(singer_id) FROM singer", False),
        # DISTINCT in col_units is cleared too: count(DISTINCT x) == count(x)
        ("SELECT count(DISTINCT country) FROM singer", "SELECT count(country) FROM singer", True),
        # ... but not inside a WHERE subquery, which rebuild_sql_col never enters
        (
            "SELECT name FROM singer WHERE age > (SELECT avg(age) FROM singer)",
            "SELECT name FROM singer WHERE age > (SELECT avg(DISTINCT age) FROM singer)",
            False,
        ),
        # values are dropped, even a column value
        (
            "SELECT name FROM singer WHERE age > 30",
            "SELECT name FROM singer WHERE age > singer_id",
            True,
        ),
        # ... but kept inside a FROM subquery
        (
            "SELECT count(*) FROM (SELECT name FROM singer WHERE country = 'France')",
            "SELECT count(*) FROM (SELECT name FROM singer WHERE country = 'Spain')",
            False,
        ),
        # JOIN ON conditions are not compared (test-suite-sql-eval), only the table units
        (
            "SELECT T1.name FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.singer_id = T2.singer_id",
            "SELECT T1.name FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.age = T2.concert_id",
            True,
        ),
        (
            "SELECT T1.name FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.singer_id = T2.singer_id",
            "SELECT T1.name FROM singer AS T1 JOIN concert AS T2 ON T1.singer_id = T2.concert_id",
            False,
        ),
        # foreign keys: singer_in_concert.singer_id -> singer.singer_id when both tables are in FROM
        (
            "SELECT T1.singer_id FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.singer_id = T2.singer_id",
            "SELECT T2.singer_id FROM singer AS T1 JOIN singer_in_concert AS T2 ON T1.singer_id = T2.singer_id",
            True,
        ),
        # ORDER BY keeps one direction, the last one written
        (
            "SELECT name FROM singer ORDER BY age DESC , name",
            "SELECT name FROM singer ORDER BY age , name DESC",
            True,
        ),
        # a value starting with a column swallows the rest up to the next AND
        (
            "SELECT name FROM singer WHERE age = singer_id OR country = 'France'",
            "SELECT name FROM singer WHERE age = singer_id",
            True,
        ),
        # LIMIT value ignored, presence not
        (
            "SELECT name FROM singer ORDER BY age LIMIT 1",
            "SELECT name FROM singer ORDER BY age LIMIT 3",
            True,
        ),
        (
            "SELECT name FROM singer ORDER BY age LIMIT 1",
            "SELECT name FROM singer ORDER BY age",
            False,
        ),
        # set operations are compared recursively
        (
            "SELECT name FROM singer WHERE age > 30 INTERSECT SELECT name FROM singer WHERE age < 50",
            "SELECT name FROM singer WHERE age > 30 UNION SELECT name FROM singer WHERE age < 50",
            False,
        ),
        # a SELECT item that is arithmetic on aggregates is unreadable, in HAVING it is fine
        (
            "SELECT country FROM singer GROUP BY country HAVING max(age) - min(age) > 10",
            "SELECT country FROM singer GROUP BY country HAVING max(age) - min(age) > 1",
            True,
        ),
    ],
)
def test_official_comparison_rules(gold, pred, verdict, schemas):
    assert exact_match(gold, pred, schemas[CONCERT]) is verdict


@pytest.mark.parametrize(
    "pred",
    [
        "",
        ";",
        "SELECT",
        "SELECT * FROM",
        "I think the answer is 42",
        "SELECT name FROM nowhere",
        "SELECT nothing FROM singer",
        "DROP TABLE singer",
        "SELECT ((((",
        "\x00\ufffd",
        "SELECT " + "a, " * 3000 + "a FROM singer",
        "SELECT " + "(" * 500 + "name" + ")" * 500 + " FROM singer",
    ],
)
def test_exact_match_never_raises_for_a_prediction(pred, schemas):
    assert exact_match("SELECT name FROM singer", pred, schemas[CONCERT]) is False


def test_unreadable_gold_raises_a_value_error_naming_it(schemas):
    bad = "SELECT name FROM singer T1"
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        exact_match(bad, "SELECT name FROM singer", schemas[CONCERT])
    with pytest.raises(ValueError, match="nowhere"):
        hardness("SELECT a FROM nowhere", schemas[CONCERT])


@pytest.mark.parametrize(
    "sql, level",
    [
        ("SELECT count(*) FROM singer", "easy"),
        ("SELECT name , country , age FROM singer ORDER BY age DESC", "medium"),
        ("SELECT song_name FROM singer WHERE age > (SELECT avg(age) FROM singer)", "hard"),
        (
            "SELECT name FROM singer WHERE age > 30 INTERSECT SELECT name FROM singer WHERE age < 50",
            "hard",
        ),
        (
            "SELECT name FROM singer WHERE age > 30 OR age < 9 INTERSECT SELECT name FROM singer WHERE age < 50",
            "extra",
        ),
        # official quirk: HAVING's aggregates are not counted (has_agg reads the NOT flag), its
        # 'and' word is: one "aggregate" in all, so this stays easy
        (
            "SELECT country FROM singer GROUP BY country HAVING count(*) > 1 AND avg(age) > 2",
            "easy",
        ),
    ],
)
def test_hardness_levels(sql, level, schemas):
    assert hardness(sql, schemas[CONCERT]) == level
