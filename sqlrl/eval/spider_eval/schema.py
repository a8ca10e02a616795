"""One tables.json entry, indexed the way Spider's evaluator names things.

The official evaluator lower-cases every name and calls a column `__table.column__`,
a table `__table__` and `*` `__all__`; its foreign-key map sends every column of a
foreign-key group to one representative. Building this per query would dominate
scoring time, so indexes are cached per db_id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALL_COLUMNS = "__all__"


def column_id(table: str, column: str) -> str:
    """The evaluator's name for a column (both parts lower-cased)."""
    return f"__{table.lower()}.{column.lower()}__"


def table_id(table: str) -> str:
    """The evaluator's name for a table unit."""
    return f"__{table.lower()}__"


@dataclass(frozen=True, eq=False)
class SchemaIndex:
    """Lookups over one database schema, with names lower-cased (hashed by identity)."""

    db_id: str
    tables: tuple[str, ...]
    columns: dict[str, tuple[str, ...]]
    column_ids: frozenset[str]
    fk_map: dict[str, str]
    column_index: dict[str, int] = field(default_factory=dict)
    table_index: dict[str, int] = field(default_factory=dict)

    def has_table(self, table: str) -> bool:
        return table in self.columns

    def qualified(self, table: str, column: str) -> str | None:
        """`table.column` as a column id, or None when the schema lacks it."""
        cid = column_id(table, column)
        return cid if cid in self.column_ids else None

    def first_owner(self, column: str, tables: list[str]) -> str | None:
        """An unqualified column belongs to the first FROM table that has it (official rule)."""
        for table in tables:
            if column in self.columns.get(table, ()):
                return column_id(table, column)
        return None

    def valid_columns(self, table_ids: list[str]) -> frozenset[str]:
        """Columns of the FROM tables: only these are eligible for foreign-key folding."""
        names = {tid[2:-2] for tid in table_ids}
        return frozenset(cid for cid in self.column_ids if cid[2 : cid.index(".")] in names)


def _foreign_key_map(entry: dict, col_ids: list[str]) -> dict[str, str]:
    """Map each foreign-key-linked column to the lowest-indexed column of its group.

    Groups are grown the way the official build_foreign_key_map grows them: a pair joins
    the first group that already holds either end, else starts a new one (groups are never
    merged), and a column in several groups takes the representative of the last one.
    """
    groups: list[set[int]] = []
    for a, b in entry.get("foreign_keys", []):
        group = next((g for g in groups if a in g or b in g), None)
        if group is None:
            group = set()
            groups.append(group)
        group.update((a, b))
    fk_map: dict[str, str] = {}
    for group in groups:
        members = sorted(group)
        for idx in members:
            fk_map[col_ids[idx]] = col_ids[members[0]]
    return fk_map


def build_index(entry: dict) -> SchemaIndex:
    """Index a raw tables.json entry (original, not normalized, names)."""
    tables = tuple(t.lower() for t in entry["table_names_original"])
    columns: dict[str, list[str]] = {t: [] for t in tables}
    col_ids: list[str] = []
    column_index: dict[str, int] = {}
    for idx, (t_idx, name) in enumerate(entry["column_names_original"]):
        if t_idx < 0:
            col_ids.append(ALL_COLUMNS)
            column_index[ALL_COLUMNS] = idx
            continue
        cid = column_id(tables[t_idx], name)
        col_ids.append(cid)
        columns[tables[t_idx]].append(name.lower())
        column_index.setdefault(cid, idx)
    return SchemaIndex(
        db_id=entry["db_id"],
        tables=tables,
        columns={t: tuple(cs) for t, cs in columns.items()},
        column_ids=frozenset(c for c in col_ids if c != ALL_COLUMNS),
        fk_map=_foreign_key_map(entry, col_ids),
        column_index=column_index,
        table_index={table_id(t): i for i, t in enumerate(tables)},
    )


_CACHE: dict[str, tuple[dict, SchemaIndex]] = {}


def schema_index(entry: dict) -> SchemaIndex:
    """The cached index for `entry`; rebuilt if a different schema reuses the db_id."""
    key = entry["db_id"]
    hit = _CACHE.get(key)
    if hit is not None:
        src, index = hit
        if src is entry or (
            src["table_names_original"] == entry["table_names_original"]
            and src["column_names_original"] == entry["column_names_original"]
            and src.get("foreign_keys") == entry.get("foreign_keys")
        ):
            return index
    index = build_index(entry)
    _CACHE[key] = (entry, index)
    return index
