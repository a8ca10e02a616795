"""Which table and column names a query writes that its database lacks (issue 46's measure).

Why: a query that names a table or column the database does not have can only fail ("no such
column"), whatever else it gets right. Evaluation reports, in every run, the share of answers
that name one (`absent_identifier_share`), so that schema-constrained decoding (sqlrl/sql/
grammar.py, `eval.constrained`) and schema repair (sqlrl/sql/schema_repair.py) can be judged
by how many such answers they remove, constrained or not, with one definition.

The rule, on sqlglot's parse of the query (SQLite dialect), names compared case-insensitively
as SQLite compares them:
- every `exp.Table` must be a table of the schema or a name the query's WITH declares;
- every `exp.Column` must be a column of some table of the schema (any table's: what the
  grammar allows after an alias such as `T1.`, since which table an alias stands for is not
  checked here either), or a name the query declares: a result-column alias (`AS cnt`,
  referred to by `ORDER BY cnt`), a FROM subquery's column alias, a CTE's or a table alias's
  column list;
- a quoted column name the schema lacks is not counted: SQLite reads a double-quoted name
  that is no column as a string (`name = "John"`, Spider's gold style), and sqlglot does not
  keep which quotes a name had, so `[nosuch]` is passed over the same way;
- `*` is no name; qualifiers (`T1` in `T1.name`) are not checked (they are the query's own
  aliases, not the database's names).
Text that is no query to sqlglot (an empty answer, a syntax error, an expression without
SELECT such as `no sql`, which sqlglot reads as `no AS sql`, several statements) names
nothing that can be checked: None.
"""

from __future__ import annotations

from sqlrl.data.spider import Schema


def parse_query(sql: str):
    """sqlglot's tree of `sql` (SQLite dialect) when it is one query (SELECT, a set
    operation, WITH ... SELECT), else None."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    if not sql or not sql.strip():
        return None
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except (SqlglotError, ValueError, RecursionError):
        return None
    return tree if isinstance(tree, exp.Query) else None


def _declared_names(tree) -> tuple[set[str], set[str]]:
    """(table names, column names) the query itself declares, lower-cased: CTE names; result
    and subquery column aliases, and the column lists of CTEs and table aliases."""
    from sqlglot import exp

    tables = {cte.alias.lower() for cte in tree.find_all(exp.CTE) if cte.alias}
    columns = {a.alias.lower() for a in tree.find_all(exp.Alias) if a.alias}
    for alias in tree.find_all(exp.TableAlias):
        columns |= {c.name.lower() for c in alias.columns if c.name}
    return tables, columns


def absent_names(sql: str, schema: Schema) -> list[str] | None:
    """The table and column names of `sql` that `schema` lacks (each once, as written, tables
    first), [] when every name exists, None when `sql` is no query to sqlglot (see the module
    docstring for the rule)."""
    from sqlglot import exp

    tree = parse_query(sql)
    if tree is None:
        return None
    schema_tables = {t.name.lower() for t in schema.tables}
    schema_columns = {c.name.lower() for t in schema.tables for c in t.columns}
    declared_tables, declared_columns = _declared_names(tree)
    absent: list[str] = []
    for table in tree.find_all(exp.Table):
        low = table.name.lower()
        if table.name and low not in schema_tables and low not in declared_tables:
            absent.append(table.name)
    for column in tree.find_all(exp.Column):
        ident = column.this
        if not isinstance(ident, exp.Identifier) or not column.name:
            continue  # `*`, `T1.*`
        low = column.name.lower()
        if low in schema_columns or low in declared_columns or ident.args.get("quoted"):
            continue
        absent.append(column.name)
    return list(dict.fromkeys(absent))


def absent_identifier_stats(sqls: list[str], schemas: list[Schema | None]) -> dict:
    """Over answers (each with its database's schema, None where unknown: not counted):
    `absent_identifier_share`, the share of answers naming at least one table or column
    their schema lacks, out of the answers with a known schema; `absent_identifier_rows`,
    their number; `unparsed_share`, the share that are no query to sqlglot (empty answers
    included), which name nothing checkable and count as naming no absent name."""
    known = [(sql, s) for sql, s in zip(sqls, schemas, strict=True) if s is not None]
    found = [absent_names(sql, schema) for sql, schema in known]
    naming = sum(bool(names) for names in found)
    n = len(known)
    return {
        "absent_identifier_share": round(naming / n, 4) if n else None,
        "absent_identifier_rows": naming,
        "unparsed_share": round(sum(names is None for names in found) / n, 4) if n else None,
    }
