"""SQL text -> the structured form Spider's official evaluator compares.

The form mirrors the one documented at the top of the official evaluation.py:

    col_unit   (agg_id, col_id, is_distinct)
    val_unit   (unit_op, col_unit1, col_unit2 | None)
    cond_unit  (not_op, op_id, val_unit, val1, val2)
    condition  [cond_unit, 'and' | 'or', cond_unit, ...]
    sql        {'select': (is_distinct, [(agg_id, val_unit), ...]),
                'from': {'table_units': [('table_unit', '__t__') | ('sql', sql)],
                         'conds': condition},
                'where': condition, 'groupBy': [col_unit], 'having': condition,
                'orderBy': [] | ('asc' | 'desc', [val_unit]), 'limit': None | 1,
                'intersect' / 'union' / 'except': None | sql}

sqlglot parses the text; this module walks its tree and accepts only what the official
reader accepts (see lexer.py for the token-level rules), so a query the official tools
cannot read raises SpiderParseError here too. Quirks kept on purpose, each read off
process_sql.py:

* in SELECT an aggregate wraps the whole val_unit (agg outside), elsewhere it sits in the
  col_unit; so `SELECT max(a) - min(b)` is unreadable while `HAVING max(a) - min(b) > 0` is fine;
* one arithmetic operator at most; no literals where a column is expected;
* a condition value that starts with a column is read as that column and the reader then
  skips to the next AND, so `a = T2.b OR c = 1` keeps only its first predicate;
* ORDER BY has one direction, the last one written (default asc);
* LIMIT only records that a limit exists (test-suite-sql-eval stores 1 for any value);
* OFFSET is tolerated only at the very end of the query (the reader ignores what is left);
* set operations chain to the right: `A UNION B EXCEPT C` is A.union = B, B.except = C,
  and a trailing ORDER BY / LIMIT belongs to the last SELECT.
"""

from __future__ import annotations

import re
from functools import lru_cache

import sqlglot
from sqlglot import exp

from sqlrl.eval.spider_eval.lexer import SpiderParseError, check_tokens, mask_strings
from sqlrl.eval.spider_eval.schema import ALL_COLUMNS, SchemaIndex, schema_index, table_id

WHERE_OPS = ("not", "between", "=", ">", "<", ">=", "<=", "!=", "in", "like", "is", "exists")
AGG_OPS = ("none", "max", "min", "count", "sum", "avg")
UNIT_OPS = ("none", "-", "+", "*", "/")

_AGG = {exp.Max: 1, exp.Min: 2, exp.Count: 3, exp.Sum: 4, exp.Avg: 5}
_ARITH = {exp.Sub: 1, exp.Add: 2, exp.Mul: 3, exp.Div: 4}
_COMPARE = {exp.EQ: 2, exp.GT: 3, exp.LT: 4, exp.GTE: 5, exp.LTE: 6, exp.NEQ: 7}
_SETOPS = {exp.Union: "union", exp.Intersect: "intersect", exp.Except: "except"}
_SELECT_ARGS = {
    "expressions",
    "distinct",
    "from_",
    "joins",
    "where",
    "group",
    "having",
    "order",
    "limit",
    "offset",
    "kind",
}
_SETOP_ARGS = {"this", "expression", "distinct", "order", "limit", "offset"}
_PLACEHOLDER = re.compile(r"__s(\d+)__")


def _swallowable(leaf: exp.Expression) -> bool:
    """Whether the official value scan can run over `leaf` to the next AND unharmed."""
    if not isinstance(leaf, (*_COMPARE, exp.Like)):
        return False
    return not any(
        isinstance(n, (exp.Func, exp.Paren, exp.Subquery, exp.Star)) for n in leaf.walk()
    )


def _leftmost(node: exp.Expression) -> exp.Expression:
    while type(node) in _ARITH:
        node = node.this
    return node


class _Reader:
    """Turns one sqlglot tree into the official structure for one schema."""

    def __init__(
        self, index: SchemaIndex, aliases: dict[str, str], values: tuple[str, ...], sql: str
    ):
        self.index = index
        self.aliases = aliases
        self.values = values
        self.sql = sql

    def fail(self, why: str):
        raise SpiderParseError(f"{why} in {self.sql!r}")

    # ---- queries -------------------------------------------------------------------------
    def query(self, node: exp.Expression, top: bool) -> dict:
        """A SELECT or a chain of set operations, right-nested like the official reader."""
        node = self._unwrap(node)
        if type(node) not in _SETOPS:
            return self.select(node, allow_offset=top)
        parts, ops, order, limit, offset = self._flatten(node)
        if offset is not None and not top:
            self.fail("OFFSET inside a subquery")
        sqls = [
            self.select(p, allow_offset=top and i == len(parts) - 1) for i, p in enumerate(parts)
        ]
        last = parts[-1]
        if order is not None:
            if last.args.get("order"):
                self.fail("two ORDER BY clauses")
            sqls[-1]["orderBy"] = self.order_by(order, self._from_tables(last))
        if limit is not None:
            if last.args.get("limit"):
                self.fail("two LIMIT clauses")
            sqls[-1]["limit"] = self.limit(limit)
        for i in range(len(ops) - 1, -1, -1):
            sqls[i][ops[i]] = sqls[i + 1]
        return sqls[0]

    def _unwrap(self, node: exp.Expression) -> exp.Expression:
        """A parenthesised query without alias or modifiers reads like the bare query."""
        while isinstance(node, exp.Subquery):
            if any(v for k, v in node.args.items() if k != "this"):
                self.fail("subquery with alias or modifiers")
            node = node.this
        return node

    def _flatten(self, node: exp.Expression):
        """Left-deep sqlglot set operations -> SELECTs and operator names in text order."""
        parts: list[exp.Select] = []
        ops: list[str] = []
        mods = {k: node.args.get(k) for k in ("order", "limit", "offset")}

        def walk(n: exp.Expression, outer: bool) -> None:
            n = self._unwrap(n) if outer else n
            if type(n) in _SETOPS:
                extra = [k for k, v in n.args.items() if v and k not in _SETOP_ARGS]
                if extra or not n.args.get("distinct", True):
                    self.fail("unsupported set operation (ALL or modifiers)")
                if n is not node and any(n.args.get(k) for k in ("order", "limit", "offset")):
                    self.fail("ORDER/LIMIT inside a set operation")
                walk(n.this, True)
                ops.append(_SETOPS[type(n)])
                right = n.expression
                if isinstance(right, exp.Subquery) and type(self._unwrap(right)) in _SETOPS:
                    self.fail("parenthesised set operation")
                walk(right, True)
            elif isinstance(n, exp.Select):
                parts.append(n)
            else:
                self.fail(f"unsupported query node {type(n).__name__}")

        walk(node, False)
        return parts, ops, mods["order"], mods["limit"], mods["offset"]

    def select(self, node: exp.Expression, allow_offset: bool) -> dict:
        if not isinstance(node, exp.Select):
            self.fail(f"unsupported query node {type(node).__name__}")
        extra = [k for k, v in node.args.items() if v and k not in _SELECT_ARGS]
        if extra or node.args.get("kind"):
            self.fail(f"unsupported SELECT parts {extra}")
        if node.args.get("offset") is not None and not allow_offset:
            self.fail("OFFSET before the end of the query")
        distinct = node.args.get("distinct")
        if distinct is not None and distinct.args.get("on"):
            self.fail("DISTINCT ON")
        table_units, from_conds, tables = self.from_clause(node)
        sql = {
            "select": (
                distinct is not None,
                [self.select_item(e, tables) for e in node.expressions],
            ),
            "from": {"table_units": table_units, "conds": from_conds},
            "where": self.condition(node.args["where"].this, tables)
            if node.args.get("where")
            else [],
            "groupBy": [self.col_unit(e, tables) for e in node.args["group"].expressions]
            if node.args.get("group")
            else [],
            "having": self.condition(node.args["having"].this, tables)
            if node.args.get("having")
            else [],
            "orderBy": self.order_by(node.args["order"], tables) if node.args.get("order") else [],
            "limit": self.limit(node.args["limit"]) if node.args.get("limit") else None,
            "intersect": None,
            "union": None,
            "except": None,
        }
        if not sql["select"][1]:
            self.fail("empty SELECT list")
        return sql

    # ---- FROM ----------------------------------------------------------------------------
    def _table_name(self, node: exp.Table) -> str:
        if (
            node.args.get("db")
            or node.args.get("catalog")
            or not isinstance(node.this, exp.Identifier)
        ):
            self.fail("qualified or computed table name")
        name = self.aliases.get(node.name.lower())
        if name is None or not self.index.has_table(name):
            self.fail(f"unknown table {node.name!r}")
        return name

    def _from_tables(self, node: exp.Select) -> list[str]:
        """The default tables for unqualified columns: plain FROM/JOIN tables, in order."""
        src = node.args.get("from_")
        items = ([src.this] if src else []) + [j.this for j in node.args.get("joins") or []]
        return [self._table_name(t) for t in items if isinstance(t, exp.Table)]

    def from_clause(self, node: exp.Select):
        src = node.args.get("from_")
        if src is None:
            self.fail("no FROM clause")
        units: list[tuple] = []
        conds: list = []
        tables: list[str] = []
        self._from_item(src.this, units, tables, first=True)
        for join in node.args.get("joins") or []:
            if join.args.get("using"):
                self.fail("JOIN USING")
            self._from_item(join.this, units, tables, first=False)
            on = join.args.get("on")
            if on is not None and not isinstance(on, exp.Boolean):
                these = self.condition(on, tables)
                if conds:
                    conds.append("and")
                conds.extend(these)
        return units, conds, tables

    def _from_item(self, item: exp.Expression, units: list, tables: list, first: bool) -> None:
        if isinstance(item, exp.Table):
            if item.args.get("joins") or item.args.get("pivots"):
                self.fail("nested join")
            name = self._table_name(item)
            units.append(("table_unit", table_id(name)))
            tables.append(name)
        elif isinstance(item, exp.Subquery) and first:
            units.append(("sql", self.query(item, top=False)))
        else:
            self.fail(f"unsupported FROM item {type(item).__name__}")

    # ---- SELECT / GROUP / ORDER / LIMIT --------------------------------------------------
    def select_item(self, node: exp.Expression, tables: list[str]) -> tuple:
        """(agg_id, val_unit); an item that starts with an aggregate keeps it outside."""
        if type(node) in _AGG:
            self._check_agg_args(node)
            inner = node.this
            if isinstance(inner, exp.Distinct):
                if len(inner.expressions) != 1 or isinstance(inner.expressions[0], exp.Paren):
                    self.fail("DISTINCT over several columns or a parenthesis")
                op, cu1, cu2 = self.val_unit(inner.expressions[0], tables)
                return _AGG[type(node)], (op, (cu1[0], cu1[1], True), cu2)
            return _AGG[type(node)], self.val_unit(inner, tables)
        if type(node) in _ARITH and type(_leftmost(node)) in _AGG:
            self.fail("arithmetic on an aggregate in SELECT")
        return 0, self.val_unit(node, tables)

    def order_by(self, node: exp.Order, tables: list[str]) -> tuple:
        direction = "asc"
        units = []
        for item in node.expressions:
            units.append(self.val_unit(item.this, tables))
            if item.args.get("desc") is True:
                direction = "desc"
            elif item.args.get("desc") is False:
                direction = "asc"
        return direction, units

    def limit(self, node: exp.Expression) -> int:
        value = node.args.get("expression")
        if not (isinstance(value, exp.Literal) and not value.is_string):
            self.fail("LIMIT without a number")
        return 1

    # ---- units ---------------------------------------------------------------------------
    def _check_agg_args(self, node: exp.Expression) -> None:
        extra = [k for k, v in node.args.items() if v and k not in ("this", "big_int")]
        if extra or node.this is None:
            self.fail(f"unsupported aggregate call {node.sql()}")

    def val_unit(self, node: exp.Expression, tables: list[str]) -> tuple:
        if isinstance(node, exp.Paren):
            return self.val_unit(node.this, tables)
        if type(node) in _ARITH:
            return (
                _ARITH[type(node)],
                self.col_unit(node.this, tables),
                self.col_unit(node.expression, tables),
            )
        return 0, self.col_unit(node, tables), None

    def col_unit(self, node: exp.Expression, tables: list[str]) -> tuple:
        if isinstance(node, exp.Paren) and isinstance(node.this, (exp.Column, exp.Star)):
            node = node.this
        if isinstance(node, exp.Star):
            return 0, ALL_COLUMNS, False
        if isinstance(node, exp.Column):
            return 0, self.column(node, tables), False
        if type(node) in _AGG:
            self._check_agg_args(node)
            arg, distinct = node.this, False
            if isinstance(arg, exp.Distinct):
                if len(arg.expressions) != 1 or isinstance(arg.expressions[0], exp.Paren):
                    self.fail("DISTINCT over several columns or a parenthesis")
                arg, distinct = arg.expressions[0], True
            if isinstance(arg, exp.Star):
                return _AGG[type(node)], ALL_COLUMNS, distinct
            if isinstance(arg, exp.Column):
                return _AGG[type(node)], self.column(arg, tables), distinct
            self.fail("aggregate over an expression")
        self.fail(f"expected a column, got {node.sql()!r}")

    def column(self, node: exp.Column, tables: list[str]) -> str:
        if (
            not isinstance(node.this, exp.Identifier)
            or node.args.get("db")
            or node.args.get("catalog")
        ):
            self.fail(f"unsupported column {node.sql()!r}")
        name = node.name.lower()
        if node.table:
            table = self.aliases.get(node.table.lower())
            cid = self.index.qualified(table, name) if table else None
        else:
            cid = self.index.first_owner(name, tables) if tables else None
        if cid is None:
            self.fail(f"unknown column {node.sql()!r}")
        return cid

    # ---- conditions ----------------------------------------------------------------------
    def condition(self, node: exp.Expression, tables: list[str]) -> list:
        """Flatten AND/OR in text order (the reader has no precedence, no parentheses)."""
        items: list = []

        def walk(n: exp.Expression) -> None:
            if isinstance(n, (exp.And, exp.Or)):
                walk(n.this)
                items.append("and" if isinstance(n, exp.And) else "or")
                walk(n.expression)
            else:
                items.append(n)

        walk(node)
        out: list = []
        i = 0
        while i < len(items):
            if i:
                out.append(items[i - 1])
            unit, trailing_column = self.cond_unit(items[i], tables)
            out.append(unit)
            i += 2
            while trailing_column and i < len(items) and items[i - 1] == "or":
                if not _swallowable(items[i]):
                    self.fail("OR after a column value")
                i += 2
        return out

    def cond_unit(self, node: exp.Expression, tables: list[str]) -> tuple[tuple, bool]:
        """(not_op, op_id, val_unit, val1, val2) and whether the last value was a column."""
        not_op = False
        if isinstance(node, exp.Not):
            node, not_op = node.this, True
            if not isinstance(node, (exp.In, exp.Like, exp.Between)):
                self.fail("NOT before a predicate")
        if node.args.get("negate"):
            if not_op:
                self.fail("double negation")
            not_op = True
        if isinstance(node, exp.Between):
            val1, _ = self.value(node.args["low"], tables)
            val2, col2 = self.value(node.args["high"], tables)
            return (not_op, 1, self.val_unit(node.this, tables), val1, val2), col2
        if isinstance(node, exp.In):
            if node.args.get("query") is not None:
                val, _ = self.value(node.args["query"], tables)
            elif len(node.expressions) == 1 and isinstance(
                node.expressions[0], (exp.Literal, exp.Neg)
            ):
                val, _ = self.value(node.expressions[0], tables)
            else:
                self.fail("IN with a list")
            extra = [
                k for k, v in node.args.items() if v and k not in ("this", "query", "expressions")
            ]
            if extra:
                self.fail("unsupported IN")
            return (not_op, 8, self.val_unit(node.this, tables), val, None), False
        if isinstance(node, exp.Like) or type(node) in _COMPARE:
            extra = [
                k for k, v in node.args.items() if v and k not in ("this", "expression", "negate")
            ]
            if extra:
                self.fail("unsupported comparison")
            op = 9 if isinstance(node, exp.Like) else _COMPARE[type(node)]
            val, col = self.value(node.expression, tables)
            return (not_op, op, self.val_unit(node.this, tables), val, None), col
        self.fail(f"unsupported predicate {type(node).__name__}")

    def value(self, node: exp.Expression, tables: list[str]):
        """A condition value: nested sql dict, "string", float, or col_unit (+ is-column flag)."""
        if isinstance(node, exp.Subquery):
            return self.query(node, top=False), False
        if isinstance(node, exp.Literal):
            if node.is_string:
                m = _PLACEHOLDER.fullmatch(node.this)
                if m is None:
                    self.fail("unexpected string literal")
                return self.values[int(m.group(1))], False
            return float(node.this), False
        if (
            isinstance(node, exp.Neg)
            and isinstance(node.this, exp.Literal)
            and not node.this.is_string
        ):
            return -float(node.this.this), False
        lead = _leftmost(node)
        if isinstance(lead, exp.Column) or type(lead) in _AGG:
            return self.col_unit(lead, tables), True
        self.fail(f"unsupported value {node.sql()!r}")


@lru_cache(maxsize=8192)
def _parse_cached(sql: str, index: SchemaIndex) -> dict:
    masked = mask_strings(sql)
    aliases = check_tokens(masked, index, sql)
    try:
        trees = sqlglot.parse(masked.for_sqlglot, read="sqlite")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as err:
        raise SpiderParseError(f"sqlglot cannot parse {sql!r}: {err}") from None
    trees = [t for t in trees if t is not None]
    if not trees:
        raise SpiderParseError(f"no statement in {sql!r}")
    return _Reader(index, aliases, masked.values, sql).query(trees[0], top=True)


def parse_sql(sql: str, schema: dict) -> dict:
    """The official structure of `sql` over `schema` (a tables.json entry).

    Raises SpiderParseError (a ValueError) for SQL the official reader cannot read.
    The result is cached and shared: treat it as read-only.
    """
    index = schema_index(schema)
    try:
        return _parse_cached(sql, index)
    except SpiderParseError:
        raise
    except (
        sqlglot.errors.SqlglotError,
        RecursionError,
        KeyError,
        IndexError,
        AttributeError,
        TypeError,
    ) as err:
        raise SpiderParseError(f"cannot read {sql!r}: {type(err).__name__}: {err}") from None
