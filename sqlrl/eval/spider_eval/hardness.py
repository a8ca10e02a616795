"""Spider's difficulty levels, counted the way the official evaluation.py counts.

Three counts over the parsed (not normalized) gold query decide the level:

* component1: WHERE, GROUP BY, ORDER BY, LIMIT present (1 each), one per extra FROM
  table unit, one per OR and per LIKE in the ON/WHERE/HAVING conditions;
* component2: nested queries - condition values that are queries, and each of
  INTERSECT/UNION/EXCEPT;
* others: more than one "aggregate", more than one SELECT item, more than one WHERE
  item, more than one GROUP BY column (1 each).

The official aggregate count has two quirks kept here for per-item agreement: in WHERE
it tests a cond_unit's first field, which is the NOT flag, and in HAVING it walks the
raw condition list, where every cond_unit with NOT and every 'and'/'or' word counts.
Likewise "more than one WHERE item" is `len(where) > 1` over the list that includes the
connectors, i.e. at least two predicates.
"""

from __future__ import annotations

from sqlrl.eval.spider_eval.parse import WHERE_OPS, parse_sql

LIKE = WHERE_OPS.index("like")


def _units(sql: dict) -> list:
    """Condition units of ON, WHERE and HAVING (each list sliced on its own)."""
    return sql["from"]["conds"][::2] + sql["where"][::2] + sql["having"][::2]


def _connectors(sql: dict) -> list:
    """The 'and'/'or' words of ON, WHERE and HAVING."""
    return sql["from"]["conds"][1::2] + sql["where"][1::2] + sql["having"][1::2]


def _flagged(unit) -> bool:
    """The official has_agg test, `unit[0] != 0`, applied to whatever it is handed."""
    return unit[0] != 0


def count_component1(sql: dict) -> int:
    """Clauses, joins, ORs and LIKEs: the official count_component1."""
    count = sum(1 for key in ("where", "groupBy", "orderBy") if sql[key])
    count += sql["limit"] is not None
    if sql["from"]["table_units"]:
        count += len(sql["from"]["table_units"]) - 1
    count += sum(1 for word in _connectors(sql) if word == "or")
    count += sum(1 for unit in _units(sql) if unit[1] == LIKE)
    return count


def count_component2(sql: dict) -> int:
    """Nested queries in conditions plus set operations: the official count_component2."""
    nested = sum(isinstance(unit[3], dict) + isinstance(unit[4], dict) for unit in _units(sql))
    return nested + sum(sql[key] is not None for key in ("intersect", "except", "union"))


def count_others(sql: dict) -> int:
    """Several aggregates / SELECT items / WHERE items / GROUP BY columns: count_others."""
    aggs = sum(_flagged(item) for item in sql["select"][1])
    aggs += sum(_flagged(unit) for unit in sql["where"][::2])
    aggs += sum(_flagged(cu) for cu in sql["groupBy"])
    if sql["orderBy"]:
        units = sql["orderBy"][1]
        aggs += sum(_flagged(vu[1]) for vu in units if vu[1]) + sum(
            _flagged(vu[2]) for vu in units if vu[2]
        )
    aggs += sum(_flagged(item) for item in sql["having"])
    return sum(
        (aggs > 1, len(sql["select"][1]) > 1, len(sql["where"]) > 1, len(sql["groupBy"]) > 1)
    )


def level(sql: dict) -> str:
    """easy / medium / hard / extra from the three counts (official thresholds)."""
    c1, c2, others = count_component1(sql), count_component2(sql), count_others(sql)
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if (
        (others > 2 and c1 <= 2 and c2 == 0)
        or (2 < c1 <= 3 and others <= 2 and c2 == 0)
        or (c1 <= 1 and others == 0 and c2 <= 1)
    ):
        return "hard"
    return "extra"


def hardness(sql: str, schema: dict) -> str:
    """The Spider difficulty of `sql` (normally a gold query) over `schema`.

    Raises ValueError naming the SQL when it cannot be read.
    """
    return level(parse_sql(sql, schema))
