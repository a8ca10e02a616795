"""Spider's exact set match without values (the official evaluation.py semantics).

Both queries are parsed to the official structure, then normalized the way the official
evaluator does before comparing:

* values are dropped: every condition value becomes None unless it is a nested query,
  whose own values are dropped in turn (rebuild_sql_val); FROM subqueries keep theirs;
* DISTINCT is ignored: the SELECT flag and every col_unit flag are cleared
  (DISABLE_DISTINCT = True; rebuild_select_col / rebuild_col_unit_col), so
  `SELECT DISTINCT a` matches `SELECT a` and count(DISTINCT a) matches count(a) - but not
  inside a WHERE subquery, which the column rebuild never enters;
* foreign keys: a column of a FROM table that is in a foreign-key group is renamed to the
  group's representative (rebuild_*_col with build_valid_col_units), again not inside
  WHERE subqueries, while set-operation branches use the outer query's FROM tables.

Then every partial component must score F1 = 1 (select, select without aggregates,
where, where without operators, group by column names, group + having, order + limit
presence, and/or set, intersect/union/except recursively, keyword set), and the FROM
table units must agree as a multiset. JOIN ON conditions are not compared beyond those
keywords, as in test-suite-sql-eval's evaluation.py.
"""

from __future__ import annotations

from sqlrl.eval.spider_eval.lexer import SpiderParseError
from sqlrl.eval.spider_eval.parse import WHERE_OPS, parse_sql
from sqlrl.eval.spider_eval.schema import SchemaIndex, schema_index

_IUE = ("intersect", "except", "union")


# ---- normalization ---------------------------------------------------------------------
def _drop_condition_values(cond: list) -> list:
    return [
        c
        if isinstance(c, str)
        else (
            c[0],
            c[1],
            c[2],
            drop_values(c[3]) if isinstance(c[3], dict) else None,
            drop_values(c[4]) if isinstance(c[4], dict) else None,
        )
        for c in cond
    ]


def drop_values(sql: dict | None) -> dict | None:
    """Condition values -> None, recursing into nested queries (not FROM subqueries)."""
    if sql is None:
        return None
    out = dict(sql)
    out["from"] = {
        "table_units": sql["from"]["table_units"],
        "conds": _drop_condition_values(sql["from"]["conds"]),
    }
    out["where"] = _drop_condition_values(sql["where"])
    out["having"] = _drop_condition_values(sql["having"])
    for key in _IUE:
        out[key] = drop_values(sql[key])
    return out


class _Folder:
    """Clears DISTINCT and folds foreign-key columns of the FROM tables."""

    def __init__(self, valid: frozenset[str], fk_map: dict[str, str]):
        self.valid = valid
        self.fk_map = fk_map

    def col(self, cu):
        if cu is None:
            return None
        agg, cid, _ = cu
        if cid in self.fk_map and cid in self.valid:
            cid = self.fk_map[cid]
        return agg, cid, None

    def val(self, vu):
        return vu[0], self.col(vu[1]), self.col(vu[2])

    def cond(self, cond: list) -> list:
        return [c if isinstance(c, str) else (c[0], c[1], self.val(c[2]), c[3], c[4]) for c in cond]

    def sql(self, sql: dict | None) -> dict | None:
        if sql is None:
            return None
        order = sql["orderBy"]
        return {
            "select": (None, [(agg, self.val(vu)) for agg, vu in sql["select"][1]]),
            "from": {
                "table_units": sql["from"]["table_units"],
                "conds": self.cond(sql["from"]["conds"]),
            },
            "where": self.cond(sql["where"]),
            "groupBy": [self.col(cu) for cu in sql["groupBy"]],
            "orderBy": (order[0], [self.val(vu) for vu in order[1]]) if order else order,
            "having": self.cond(sql["having"]),
            "limit": sql["limit"],
            **{key: self.sql(sql[key]) for key in _IUE},
        }


def normalize(sql: dict, index: SchemaIndex) -> dict:
    """The form the official evaluator compares: values dropped, DISTINCT cleared, FKs folded."""
    tables = [tu[1] for tu in sql["from"]["table_units"] if tu[0] == "table_unit"]
    return _Folder(index.valid_columns(tables), index.fk_map).sql(drop_values(sql))


# ---- comparison ------------------------------------------------------------------------
def _matched(pred: list, gold: list) -> int:
    """How many of `pred` find a distinct equal partner in `gold` (multiset overlap)."""
    left = list(gold)
    count = 0
    for item in pred:
        if item in left:
            left.remove(item)
            count += 1
    return count


def _full(count: int, pred_total: int, gold_total: int) -> bool:
    """The official get_scores F1 is 1 exactly when totals agree and everything matched."""
    return pred_total == gold_total and count == pred_total


def _keywords(sql: dict) -> set[str]:
    found = set()
    for key, name in (("where", "where"), ("groupBy", "group"), ("having", "having")):
        if sql[key]:
            found.add(name)
    if sql["orderBy"]:
        found.update((sql["orderBy"][0], "order"))
    if sql["limit"] is not None:
        found.add("limit")
    found.update(key for key in _IUE if sql[key] is not None)
    if "or" in sql["from"]["conds"][1::2] + sql["where"][1::2] + sql["having"][1::2]:
        found.add("or")
    units = sql["from"]["conds"][::2] + sql["where"][::2] + sql["having"][::2]
    if any(u[0] for u in units):
        found.add("not")
    if any(u[1] == WHERE_OPS.index("in") for u in units):
        found.add("in")
    if any(u[1] == WHERE_OPS.index("like") for u in units):
        found.add("like")
    return found


def _group_name(cid: str) -> str:
    return cid.split(".")[1] if "." in cid else cid


def _components_match(pred: dict, gold: dict) -> bool:
    """Every partial score of the official eval_partial_match equals 1."""
    p_sel, g_sel = pred["select"][1], gold["select"][1]
    if not _full(_matched(p_sel, g_sel), len(p_sel), len(g_sel)):
        return False  # select
    if not _full(_matched([u[1] for u in p_sel], [u[1] for u in g_sel]), len(p_sel), len(g_sel)):
        return False  # select (no AGG)
    p_where, g_where = pred["where"][::2], gold["where"][::2]
    if not _full(_matched(p_where, g_where), len(p_where), len(g_where)):
        return False  # where
    if not _full(
        _matched([u[2] for u in p_where], [u[2] for u in g_where]), len(p_where), len(g_where)
    ):
        return False  # where (no OP)
    p_group = [_group_name(cu[1]) for cu in pred["groupBy"]]
    g_group = [_group_name(cu[1]) for cu in gold["groupBy"]]
    if not _full(_matched(p_group, g_group), len(p_group), len(g_group)):
        return False  # group (no Having)
    if bool(pred["groupBy"]) != bool(gold["groupBy"]):
        return False  # group
    if gold["groupBy"] and (
        [cu[1] for cu in pred["groupBy"]] != [cu[1] for cu in gold["groupBy"]]
        or pred["having"] != gold["having"]
    ):
        return False
    if bool(pred["orderBy"]) != bool(gold["orderBy"]):
        return False  # order
    if gold["orderBy"] and (
        pred["orderBy"] != gold["orderBy"] or (pred["limit"] is None) != (gold["limit"] is None)
    ):
        return False
    if set(pred["where"][1::2]) != set(gold["where"][1::2]):
        return False  # and/or
    for key in _IUE:  # IUEN
        if (pred[key] is None) != (gold[key] is None):
            return False
        if gold[key] is not None and not _exact(pred[key], gold[key]):
            return False
    return _keywords(pred) == _keywords(gold)  # keywords


def _exact(pred: dict, gold: dict) -> bool:
    """The official Evaluator.eval_exact_match on normalized structures."""
    if not _components_match(pred, gold):
        return False
    g_units, p_units = gold["from"]["table_units"], pred["from"]["table_units"]
    if g_units:
        return len(g_units) == len(p_units) and _matched(p_units, g_units) == len(g_units)
    return True


def exact_match(gold_sql: str, pred_sql: str, schema: dict) -> bool:
    """Spider exact set match without values.

    Never raises for the prediction (unreadable -> False); raises ValueError naming the
    gold SQL when the gold itself is unreadable, so callers can count such items.
    Like test-suite-sql-eval, the prediction's " value " placeholders read as " 1 ".
    """
    index = schema_index(schema)
    try:
        gold = normalize(parse_sql(gold_sql, schema), index)
    except SpiderParseError as err:
        raise ValueError(
            f"gold SQL is unreadable for db {index.db_id!r}: {gold_sql!r} ({err})"
        ) from None
    try:
        pred = normalize(parse_sql(str(pred_sql).replace(" value ", " 1 "), schema), index)
        return bool(_exact(pred, gold))
    except Exception:  # noqa: BLE001 - an unreadable or odd prediction scores 0, never crashes
        return False
