"""Schema-grounding augmentation of the SFT training data (the small CPU model's crutch).

A small model trained from scratch on Spider memorises the training databases' table names
instead of reading the schema in its prompt. Augmented copies of each training example make
copying from the schema the only way to be right:
- `shuffle_schema`: tables, and columns within each table, in a random order;
- `rename_prob`: each table and column name is renamed with this probability, consistently in
  the schema text, in the gold SQL (identifier tokens located with sqlglot's SQLite tokenizer and
  replaced in place, so the SQL keeps Spider's style; the result is re-parsed and checked) and
  in the question's literal mentions (case-insensitive, also with underscores shown as spaces).
  A query that cannot be renamed safely keeps its original names (counted in the stats).
Only the SFT rows are augmented; GRPO needs gold SQL executable against the real database, and
dev/heldout are never augmented.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field

from sqlrl.data.spider import PLAIN_IDENTIFIER, Column, ForeignKey, Schema, Table

# Variants that keep the meaning of a name but not its spelling.
_PREFIXES = ["tbl_", "t_", "the_", "my_", "app_", "x_", "data_", "rec_"]
_SUFFIXES = ["_info", "_data", "_rec", "_tbl", "_list", "_val", "_field", "_entry", "_x", "s"]


@dataclass
class AugmentStats:
    examples: int = 0
    renamed: int = 0
    rename_unsafe: int = 0  # kept their original names: the SQL could not be renamed safely
    question_mentions: int = 0  # literal mentions rewritten in questions
    reasons: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {
            "examples": self.examples,
            "renamed": self.renamed,
            "rename_unsafe": self.rename_unsafe,
            "question_mentions": self.question_mentions,
            "unsafe_reasons": dict(sorted(self.reasons.items())),
        }


def name_pools(schemas) -> tuple[list[str], list[str]]:
    """All plain table and column names of `schemas` (the vocabulary new names come from)."""
    tables, columns = set(), set()
    for schema in schemas:
        for t in schema.tables:
            if PLAIN_IDENTIFIER.fullmatch(t.name):
                tables.add(t.name)
            for c in t.columns:
                if PLAIN_IDENTIFIER.fullmatch(c.name):
                    columns.add(c.name)
    return sorted(tables), sorted(columns)


def _is_keyword(name: str) -> bool:
    from sqlglot.tokens import TokenType

    tokens = _tokenize(name)
    return len(tokens) != 1 or tokens[0].token_type != TokenType.VAR


def _tokenize(sql: str):
    import sqlglot

    return sqlglot.Dialect.get_or_raise("sqlite").tokenize(sql)


def _new_name(old: str, pool: list[str], taken: set[str], rng: random.Random) -> str | None:
    for _ in range(20):
        if rng.random() < 0.5:
            cand = rng.choice(pool)
        elif rng.random() < 0.5:
            cand = rng.choice(_PREFIXES) + old
        else:
            cand = old + rng.choice(_SUFFIXES)
        if (
            PLAIN_IDENTIFIER.fullmatch(cand)
            and cand.lower() not in taken
            and cand.lower() != old.lower()
            and not _is_keyword(cand)
        ):
            return cand
    return None


def rename_map(schema: Schema, rename_prob: float, pools, rng: random.Random) -> dict[str, str]:
    """lowercase old name -> new name; one name space for tables and columns, so a name that
    is both (or a join key present in several tables) is renamed the same way everywhere."""
    table_pool, column_pool = pools
    names: dict[str, tuple[str, bool]] = {}  # lower -> (original spelling, is_table)
    for t in schema.tables:
        names.setdefault(t.name.lower(), (t.name, True))
        for c in t.columns:
            names.setdefault(c.name.lower(), (c.name, False))
    taken = set(names)
    mapping: dict[str, str] = {}
    for low, (orig, is_table) in names.items():
        if not PLAIN_IDENTIFIER.fullmatch(orig) or rng.random() >= rename_prob:
            continue
        new = _new_name(orig, table_pool if is_table else column_pool, taken, rng)
        if new:
            mapping[low] = new
            taken.add(new.lower())
    return mapping


def rename_schema(schema: Schema, mapping: dict[str, str]) -> Schema:
    def rn(name: str) -> str:
        return mapping.get(name.lower(), name)

    tables = tuple(
        Table(rn(t.name), tuple(Column(rn(c.name), c.type, c.is_primary) for c in t.columns))
        for t in schema.tables
    )
    fks = tuple(
        ForeignKey(rn(f.table), rn(f.column), rn(f.ref_table), rn(f.ref_column))
        for f in schema.foreign_keys
    )
    return Schema(schema.db_id, tables, fks)


def shuffle_schema(schema: Schema, rng: random.Random) -> Schema:
    tables = list(schema.tables)
    rng.shuffle(tables)
    out = []
    for t in tables:
        cols = list(t.columns)
        rng.shuffle(cols)
        out.append(Table(t.name, tuple(cols)))
    return Schema(schema.db_id, tuple(out), schema.foreign_keys)


class UnsafeRename(ValueError):
    pass


def rename_sql(sql: str, mapping: dict[str, str]) -> str:
    """Rename identifiers of `sql` by `mapping` in place; UnsafeRename when it can't be sure."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.tokens import TokenType

    try:
        tree = sqlglot.parse_one(sql, dialect="sqlite")
        tokens = _tokenize(sql)
    except Exception as exc:  # noqa: BLE001 - sqlglot raises several types
        raise UnsafeRename("parse") from exc
    aliases = {a.alias.lower() for a in tree.find_all(exp.Alias, exp.TableAlias) if a.alias}
    aliases |= {t.alias.lower() for t in tree.find_all(exp.Table) if t.alias}
    if aliases & set(mapping):
        raise UnsafeRename("alias")
    pieces, last = [], 0
    for i, tok in enumerate(tokens):
        low = tok.text.lower()
        if low not in mapping or tok.token_type == TokenType.STRING:
            continue
        if tok.token_type == TokenType.IDENTIFIER:  # "quoted": a value or an odd name
            raise UnsafeRename("quoted")
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if nxt is not None and nxt.token_type == TokenType.L_PAREN:
            continue  # a function call such as count(...)
        raw = sql[tok.start : tok.end + 1]
        if raw.lower() != low:
            raise UnsafeRename("token")
        pieces.append(sql[last : tok.start])
        pieces.append(mapping[low])
        last = tok.end + 1
    pieces.append(sql[last:])
    out = "".join(pieces)
    # Check: every table and column the renamed query names is a renamed (or untouched) name.
    try:
        new_tree = sqlglot.parse_one(out, dialect="sqlite")
    except Exception as exc:  # noqa: BLE001
        raise UnsafeRename("reparse") from exc
    olds = set(mapping)
    for node in new_tree.find_all(exp.Table, exp.Column):
        if node.name.lower() in olds and node.name.lower() not in {
            v.lower() for v in mapping.values()
        }:
            raise UnsafeRename("leftover")
    return out


def rename_question(question: str, mapping: dict[str, str]) -> tuple[str, int]:
    """Rewrite literal mentions of renamed names (case-insensitive; `_` also as a space)."""
    count = 0
    # longest names first, so `head_ID` is rewritten before `head`
    for low in sorted(mapping, key=len, reverse=True):
        new = mapping[low]
        variants = {low, low.replace("_", " ")}
        for variant in sorted(variants, key=lambda v: (-len(v), v)):  # not set order: seeded runs
            if len(variant) < 2:
                continue
            pattern = re.compile(
                r"(?<![\w])" + re.escape(variant) + r"(?:e?s)?(?![\w])", re.IGNORECASE
            )
            shown = new if "_" in variant or " " not in variant else new.replace("_", " ")
            if "_" not in variant and "_" in low:
                shown = new.replace("_", " ")
            question, n = pattern.subn(shown, question)
            count += n
    return question, count


@dataclass
class Augmenter:
    """Makes augmented copies of (schema, question, sql) examples; deterministic by seed."""

    shuffle: bool
    rename_prob: float
    pools: tuple[list[str], list[str]]
    seed: int
    stats: AugmentStats = field(default_factory=AugmentStats)

    def augment(self, schema: Schema, question: str, sql: str, key: str):
        """(schema, question, sql) of one augmented copy; `key` seeds it (e.g. index:copy)."""
        rng = random.Random(f"{self.seed}:augment:{key}")
        self.stats.examples += 1
        if self.rename_prob > 0:
            mapping = rename_map(schema, self.rename_prob, self.pools, rng)
            if mapping:
                try:
                    new_sql = rename_sql(sql, mapping)
                except UnsafeRename as exc:
                    self.stats.rename_unsafe += 1
                    self.stats.reasons[str(exc)] += 1
                else:
                    sql = new_sql
                    schema = rename_schema(schema, mapping)
                    question, n = rename_question(question, mapping)
                    self.stats.question_mentions += n
                    self.stats.renamed += 1
        if self.shuffle:
            schema = shuffle_schema(schema, rng)
        return schema, question, sql


def schema_mentions(question: str, schema: Schema) -> list[str]:
    """Schema names the question mentions literally (case-insensitive; `_` also as a space;
    a plural s/es allowed), in schema order, tables first as `table`, columns as `table.column`
    (a column name that several tables share is listed once per table)."""
    text = " ".join(question.split())

    def mentioned(name: str) -> bool:
        for variant in {name.lower(), name.lower().replace("_", " ")}:
            if len(variant) >= 2 and re.search(
                r"(?<![\w])" + re.escape(variant) + r"(?:e?s)?(?![\w])", text, re.IGNORECASE
            ):
                return True
        return False

    found = [t.name for t in schema.tables if mentioned(t.name)]
    for t in schema.tables:
        found.extend(f"{t.name}.{c.name}" for c in t.columns if mentioned(c.name))
    return found


def mark_question(question: str, schema: Schema) -> str:
    """The question followed by the schema names it mentions (prepare.mark_schema_mentions)."""
    found = schema_mentions(question, schema)
    return f"{question} Schema mentions: {', '.join(found) if found else '(none)'}."
