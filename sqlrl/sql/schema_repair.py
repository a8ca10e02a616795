"""Schema repair at decoding: map table and column names the database does not have onto the
ones it has (`eval.schema_repair`, and the server for requests that name a database).

Why: a small model trained from scratch learns SQL structure but writes table and column names
memorised from the training databases; on a new database such a query can only fail ("no such
table"). Repair keeps the model's query and swaps each unknown name for the most likely real
one: a near-identical spelling first (ages -> Age), then a name the question mentions
(`sqlrl.data.augment.schema_mentions`), then the most similar spelling (difflib). Constraining names
to the schema is what grammar-constrained decoders such as PICARD do during generation; this
does it after, on the parsed query (sqlglot).

Only unknown names change, so a query that runs is returned as it is: repair can turn a query
that would fail into one that runs, never the other way round. Double-quoted names (SQLite reads
an unknown one as a string), column aliases, CTE names and columns of subqueries are left alone.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

from sqlrl.data.augment import schema_mentions
from sqlrl.data.spider import Schema, Table

CLOSE = 0.8  # similarity of a spelling variant (ages/Age, singers/singer)
CLOSE_BONUS = 2.0  # a spelling variant of a real name is that name
MENTION_BONUS = 1.0  # otherwise a name the question mentions beats any other similarity
REUSE_PENALTY = 0.5  # two different unknown tables should not collapse onto one table


def _similarity(a: str, b: str) -> float:
    """Spelling similarity in [0, 1], plus CLOSE_BONUS for a near-identical spelling."""
    ratio = difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio()
    return ratio + (CLOSE_BONUS if ratio >= CLOSE else 0.0)


def repairer(
    schemas: dict[str, Schema], db_ids: Sequence[str], questions: Sequence[str]
) -> Callable[[int, str], str]:
    """repair(i, sql) for a batch whose item i asks questions[i] of database db_ids[i]; SQL for
    a database `schemas` does not know is returned as it is."""

    def repair(i: int, sql: str) -> str:
        schema = schemas.get(db_ids[i])
        return sql if schema is None else repair_sql(sql, schema, questions[i])

    return repair


def repair_sql(sql: str, schema: Schema, question: str) -> str:
    """`sql` with unknown table and column names replaced by names of `schema`; `sql` itself
    when every name exists, when it does not parse, or when the schema has no tables."""
    import sqlglot

    if not sql or not schema.tables:
        return sql
    try:
        tree = sqlglot.parse_one(sql, dialect="sqlite")
    except Exception:  # noqa: BLE001 - sqlglot raises several types; unparsable stays as is
        return sql
    if tree is None:
        return sql
    mentions = schema_mentions(question, schema)
    changed = _repair_tables(tree, schema, mentions)
    changed |= _repair_columns(tree, schema, mentions)
    if not changed:
        return sql
    try:
        return tree.sql(dialect="sqlite")
    except Exception:  # noqa: BLE001
        return sql


def _repair_tables(tree, schema: Schema, mentions: list[str]) -> bool:
    from sqlglot import exp

    tables = {t.name.lower() for t in schema.tables}
    ctes = {cte.alias.lower() for cte in tree.find_all(exp.CTE) if cte.alias}
    mentioned = {m for m in mentions if "." not in m}
    mentioned_via_column = {m.split(".", 1)[0] for m in mentions if "." in m}
    used = {t.name.lower() for t in tree.find_all(exp.Table) if t.name.lower() in tables}
    mapping: dict[str, str] = {}
    changed = False
    for node in list(tree.find_all(exp.Table)):
        name = node.name
        low = name.lower()
        if not name or low in tables or low in ctes or node.this.args.get("quoted"):
            continue
        if low not in mapping:

            def score(table: Table, name=name) -> float:
                s = _similarity(name, table.name)
                s += MENTION_BONUS if table.name in mentioned else 0.0
                s += 0.3 * MENTION_BONUS if table.name in mentioned_via_column else 0.0
                s -= REUSE_PENALTY if table.name.lower() in used else 0.0
                return s

            best = max(schema.tables, key=score)
            mapping[low] = best.name
            used.add(best.name.lower())
        node.set("this", exp.to_identifier(mapping[low]))
        changed = True
    return changed


def _repair_columns(tree, schema: Schema, mentions: list[str]) -> bool:
    from sqlglot import exp

    by_name = {t.name.lower(): t for t in schema.tables}
    scope: dict[str, Table] = {}  # table name or alias -> table
    in_query: list[Table] = []
    for node in tree.find_all(exp.Table):
        table = by_name.get(node.name.lower())
        if table is not None:
            scope[node.alias_or_name.lower()] = table
            scope[table.name.lower()] = table
            if table not in in_query:
                in_query.append(table)
    if not in_query:
        return False
    output_aliases = {a.alias.lower() for a in tree.find_all(exp.Alias) if a.alias}
    mentioned = {tuple(m.split(".", 1)) for m in mentions if "." in m}
    changed = False
    for col in list(tree.find_all(exp.Column)):
        name = col.name
        ident = col.this
        if (
            not name
            or name == "*"
            or not isinstance(ident, exp.Identifier)
            or ident.args.get("quoted")
            or name.lower() in output_aliases
        ):
            continue
        qualifier = col.table.lower()
        if qualifier and qualifier not in scope:
            continue  # a subquery's alias: its columns are not the schema's
        candidates = [scope[qualifier]] if qualifier else in_query
        if any(c.name.lower() == name.lower() for t in candidates for c in t.columns):
            continue

        def score(pair, name=name) -> float:
            table, column = pair
            s = _similarity(name, column.name)
            return s + (MENTION_BONUS if (table.name, column.name) in mentioned else 0.0)

        pairs = [(t, c) for t in candidates for c in t.columns]
        if not pairs:
            continue
        _, best = max(pairs, key=score)
        col.set("this", exp.to_identifier(best.name))
        changed = True
    return changed
