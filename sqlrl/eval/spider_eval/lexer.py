"""The token-level rules of Spider's official SQL reader, checked before sqlglot parses.

The official reader (process_sql.py) does not parse SQL; it splits text with NLTK's word
tokenizer and walks the tokens. Some SQL that sqlglot reads happily is therefore
unreadable to it, and an unreadable prediction scores 0 there. To agree with it per item
we reject the same inputs. The rules below were derived by reading process_sql.py and
NLTK's tokenizer, not copied:

* quotes: every `'` counts as `"`; quote characters pair up left to right, so an odd
  count, or a string with an apostrophe inside (`"Mary's"`), is unreadable, and two
  strings in a row (`'O''Brien'`) leave a stray value token;
* NLTK splits around ( ) [ ] { } < > ; @ # $ % & ? ! * and commas, but not around
  = + - / . so `a=b`, `x='y'` or `a-b` stay single unreadable tokens;
* `<>` becomes `<` `>` (no such operator); only `!=`, `>=`, `<=` are re-joined;
* comments (`--`, `/* */`) and glued literals (`LIKE'%a%'`) are unreadable;
* a NOT that opens a predicate (`WHERE NOT ...`, `NOT EXISTS`) is unreadable;
* tables take aliases only with AS, and no alias may equal a table name;
* FROM items are joined only by JOIN (no comma joins); LEFT/INNER/... are unreadable,
  except right after an ON whose last value is a column, where they are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlrl.eval.spider_eval.schema import SchemaIndex


class SpiderParseError(ValueError):
    """The SQL is outside what Spider's official evaluator can read."""


_QUOTES = re.compile(r"['\"]")
_SPLIT = re.compile(r"(\s+|[()\[\]{}<>;@#$%&?!*,])")
_WORD = re.compile(r"\w+(\.\w+)?")
_VALUE_WORD = re.compile(r"__val\d+__")
_ALONE = {
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    ";",
    "@",
    "#",
    "$",
    "%",
    "&",
    "?",
    "!",
    "*",
    ",",
    "=",
    "!=",
    ">=",
    "<=",
    "+",
    "-",
    "/",
}
CLAUSE_KEYWORDS = (
    "select",
    "from",
    "where",
    "group",
    "order",
    "limit",
    "intersect",
    "union",
    "except",
)
JOIN_MODIFIERS = ("left", "right", "inner", "outer", "cross", "natural", "full")
_NOT_OPENERS = ("where", "having", "and", "or", "on", "(")
_KEYWORDS = (
    set(CLAUSE_KEYWORDS)
    | set(JOIN_MODIFIERS)
    | {
        "and",
        "or",
        "not",
        "on",
        "join",
        "as",
        "by",
        "having",
        "between",
        "like",
        "in",
        "is",
        "exists",
        "distinct",
        "asc",
        "desc",
        "null",
    }
)


@dataclass(frozen=True)
class Masked:
    """The SQL with string literals swapped for placeholders, and the literal texts."""

    for_sqlglot: str  # literals replaced by '__sN__' (still SQL strings)
    for_tokens: str  # literals replaced by the word __valN__ (as the official reader does)
    values: tuple[str, ...]  # each literal as the official reader keeps it: "text"


def mask_strings(sql: str) -> Masked:
    """Pair quotes like the official reader; raise if that pairing leaves it stuck."""
    pos = [m.start() for m in _QUOTES.finditer(sql)]
    if len(pos) % 2:
        raise SpiderParseError(f"unbalanced quotes in {sql!r}")
    glot, words, values = [], [], []
    last = 0
    for n in range(0, len(pos), 2):
        start, end = pos[n], pos[n + 1]
        gap = sql[last:start]
        if n and not gap.strip():
            raise SpiderParseError(f"two string literals in a row in {sql!r}")
        glot += [gap, f"'__s{n // 2}__'"]
        words += [gap, f"__val{n // 2}__"]
        values.append('"' + sql[start + 1 : end] + '"')
        last = end + 1
    glot.append(sql[last:])
    words.append(sql[last:])
    return Masked("".join(glot), "".join(words), tuple(values))


def official_tokens(text: str) -> list[str]:
    """Split like NLTK's word tokenizer does on SQL, lower-case, and re-join !=, >=, <=."""
    toks = [t.lower() for t in _SPLIT.split(text) if t and not t.isspace()]
    out: list[str] = []
    for tok in toks:
        if tok == "=" and out and out[-1] in ("!", ">", "<"):
            out[-1] += "="
        else:
            out.append(tok)
    return out


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def _check_atoms(toks: list[str], sql: str) -> None:
    """Each token must be something the official reader can place on its own."""
    for tok in toks:
        if (
            tok in _ALONE
            or _VALUE_WORD.fullmatch(tok)
            or _is_number(tok)
            or (_WORD.fullmatch(tok) and "__val" not in tok)
        ):
            continue
        raise SpiderParseError(
            f"token {tok!r} is not separable by the official tokenizer in {sql!r}"
        )
    for a, b in zip(toks, toks[1:], strict=False):
        if a == "<" and b == ">":
            raise SpiderParseError(f"'<>' is not an official operator in {sql!r}")


def _check_not(toks: list[str], sql: str) -> None:
    """NOT may only follow a column (a NOT IN / NOT LIKE / NOT BETWEEN)."""
    for i, tok in enumerate(toks):
        if tok == "not" and (i == 0 or toks[i - 1] in _NOT_OPENERS):
            raise SpiderParseError(f"prefix NOT is unreadable officially in {sql!r}")


def _is_column_token(tok: str) -> bool:
    return (
        bool(_WORD.fullmatch(tok))
        and tok not in _KEYWORDS
        and not _is_number(tok)
        and not _VALUE_WORD.fullmatch(tok)
    )


def _check_from_clauses(toks: list[str], sql: str) -> None:
    """Walk every FROM clause with the official reader's expectations (see module doc)."""
    stack: list[str | None] = []  # per open parenthesis: the FROM state outside it
    state: str | None = None  # None (not in FROM), table, named, alias, after, on
    for i, tok in enumerate(toks):
        if tok == "(":
            stack.append("after" if state == "table" else state)
            state = None
            continue
        if tok == ")":
            state = stack.pop() if stack else None
            continue
        if state is None:
            if tok == "from":
                state = "table"
            continue
        if tok in CLAUSE_KEYWORDS or tok == ";":
            state = "table" if tok == "from" else None
            continue
        if state == "table":
            state = "named"
        elif state == "named" and tok == "as":
            state = "alias"
        elif state == "alias":
            state = "after"
        elif state in ("named", "after"):
            if tok == "join":
                state = "table"
            elif tok == "on":
                state = "on"
            else:
                raise SpiderParseError(f"unexpected {tok!r} after a FROM table in {sql!r}")
        elif state == "on":
            if tok == "join":
                state = "table"
            elif tok in JOIN_MODIFIERS:
                prev = toks[i - 1]
                if not (_is_column_token(prev) or (prev in JOIN_MODIFIERS and i > 1)):
                    raise SpiderParseError(
                        f"join modifier {tok!r} is unreadable officially in {sql!r}"
                    )


def alias_map(toks: list[str], index: SchemaIndex, sql: str) -> dict[str, str]:
    """`X AS Y` anywhere in the query makes Y mean X everywhere (the official rule)."""
    aliases: dict[str, str] = {}
    for i, tok in enumerate(toks):
        if tok == "as" and 0 < i < len(toks) - 1:
            aliases[toks[i + 1]] = toks[i - 1]
    for table in index.tables:
        if table in aliases:
            raise SpiderParseError(f"alias {table!r} shadows a table in {sql!r}")
        aliases[table] = table
    return aliases


def check_tokens(masked: Masked, index: SchemaIndex, sql: str) -> dict[str, str]:
    """Run every token rule on `masked`; return the query's alias map."""
    if "--" in masked.for_tokens or "/*" in masked.for_tokens:
        raise SpiderParseError(f"SQL comments are unreadable officially in {sql!r}")
    toks = official_tokens(masked.for_tokens)
    _check_atoms(toks, sql)
    _check_not(toks, sql)
    _check_from_clauses(toks, sql)
    return alias_map(toks, index, sql)
