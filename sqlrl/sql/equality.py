"""When a predicted query's result counts as equal to the gold result (execution accuracy).

Our own implementation of the semantics of the Spider test-suite evaluator
(taoyds/test-suite-sql-eval, exec_eval.py), written from its description, with each choice:

* Rows are multisets (bag semantics): duplicates count, row order is ignored ...
* ... unless the gold SQL contains ORDER BY anywhere (a keyword token, not text inside a string
  literal), as the test suite decides; then rows are compared in order. An ORDER BY inside a
  subquery therefore also makes order matter, exactly as in the test suite.
* Columns may be permuted: `SELECT a, b` matches `SELECT b, a`. Column names never matter.
  The test suite prunes candidate permutations by sampling rows; we pair each gold column only
  with predicted columns holding the same multiset of values (a necessary condition), check
  value pairs with the previous column while searching, treat identical predicted columns as
  one, and try at most `max_permutations` pairings. Beyond that bound (only wide results of
  columns with the same values in different row arrangements) the answer is "not equal".
* Both results empty: equal, whatever their columns (test suite: `[] == []`).
  Different row counts or column counts: not equal.
* DISTINCT: by default every DISTINCT keyword is removed from both queries before execution,
  as the test suite does unless `--keep_distinct` (its `remove_distinct` drops the token
  everywhere, so `count(DISTINCT x)` becomes `count(x)` too). `keep_distinct=True` keeps them.
* Values are compared exactly as SQLite returns them, with Python equality: no float tolerance,
  `1 == 1.0` (same number), `'1' != 1`, `NULL == NULL`, text and blobs differ.
* The test suite's `postprocess` joins split comparison operators (`> =` to `>=`); we do the
  same, on tokens, so string literals are untouched.
* Not copied: the official evaluator rewrites every "value" substring of a prediction to "1"
  (a leftover that breaks columns named value), and turns MySQL's YEAR(CURDATE()) into 2020
  (not SQLite). A gold query that fails is never equal to anything.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

from sqlglot.errors import SqlglotError
from sqlglot.tokens import Tokenizer, TokenType

_SPLIT_OPERATORS = {
    (TokenType.GT, TokenType.EQ),
    (TokenType.LT, TokenType.EQ),
    (TokenType.NOT, TokenType.EQ),
    (TokenType.EQ, TokenType.EQ),
}
MAX_PERMUTATIONS = 20_000
# Cheap text tests that rule out the token work (they may match inside literals; tokens decide).
_ORDER_BY = re.compile(r"order\s+by", re.I)
_MAY_NORMALIZE = re.compile(r"distinct|[<>!=]\s+=", re.I)


def _tokens(sql: str) -> list | None:
    """sqlglot tokens with character offsets, or None when the text does not tokenize."""
    try:
        return Tokenizer().tokenize(sql)
    except (SqlglotError, ValueError, RecursionError):
        return None


@lru_cache(maxsize=65_536)  # gold queries repeat across reward batches
def order_matters(gold_sql: str) -> bool:
    """Whether row order is compared: the gold SQL contains an ORDER BY keyword."""
    if not _ORDER_BY.search(gold_sql):
        return False
    tokens = _tokens(gold_sql)
    if tokens is None:  # untokenizable gold: fall back to the test suite's plain text test
        return "order by" in " ".join(gold_sql.lower().split())
    return any(t.token_type == TokenType.ORDER_BY for t in tokens)


@lru_cache(maxsize=65_536)
def normalize_sql(sql: str, keep_distinct: bool = False) -> str:
    """`sql` as executed for comparison: DISTINCT removed (unless kept), `> =` joined to `>=`.

    Only the affected characters are cut, so everything else (literals, spacing) is verbatim.
    Text that does not tokenize is returned unchanged; it will fail on execution anyway.
    """
    if not _MAY_NORMALIZE.search(sql):  # the common case: nothing to do, skip tokenizing
        return sql
    tokens = _tokens(sql)
    if not tokens:
        return sql
    cuts: list[tuple[int, int]] = []  # [start, end) spans to delete
    for prev, tok in zip([None, *tokens], tokens, strict=False):
        if tok.token_type == TokenType.DISTINCT and not keep_distinct:
            cuts.append((tok.start, tok.end + 1))
        elif (
            prev is not None
            and (prev.token_type, tok.token_type) in _SPLIT_OPERATORS
            and prev.end + 1 < tok.start
            and not sql[prev.end + 1 : tok.start].strip()
        ):
            cuts.append((prev.end + 1, tok.start))
    if not cuts:
        return sql
    pieces, last = [], 0
    for start, end in cuts:
        pieces.append(sql[last:start])
        last = end
    pieces.append(sql[last:])
    return "".join(pieces)


def results_match(
    gold_rows: Sequence[tuple],
    pred_rows: Sequence[tuple],
    ordered: bool,
    max_permutations: int = MAX_PERMUTATIONS,
) -> bool:
    """Whether `pred_rows` equals `gold_rows` up to a column permutation (see module doc)."""
    if not gold_rows and not pred_rows:
        return True
    if len(gold_rows) != len(pred_rows):
        return False
    width = len(gold_rows[0])
    if any(len(row) != width for row in pred_rows) or any(len(r) != width for r in gold_rows):
        return False
    if _rows_equal(gold_rows, pred_rows, ordered):
        return True
    if width == 1 or not _same_unordered_rows(gold_rows, pred_rows, ordered):
        return False
    for perm in _column_pairings(gold_rows, pred_rows, ordered, max_permutations):
        permuted = [tuple(row[j] for j in perm) for row in pred_rows]
        if _rows_equal(gold_rows, permuted, ordered):
            return True
    return False


def _rows_equal(gold_rows, pred_rows, ordered: bool) -> bool:
    if ordered:
        return list(gold_rows) == list(pred_rows)
    return Counter(gold_rows) == Counter(pred_rows)


def _same_unordered_rows(gold_rows, pred_rows, ordered: bool) -> bool:
    """A cheap necessary condition: the rows agree as bags of values, ignoring column order."""
    if ordered:
        return all(_bag(g) == _bag(p) for g, p in zip(gold_rows, pred_rows, strict=False))
    return Counter(map(_bag, gold_rows)) == Counter(map(_bag, pred_rows))


def _column_pairings(gold_rows, pred_rows, ordered: bool, limit: int):
    """Candidate permutations (perm[i]: the predicted column placed at gold column i).

    Depth-first over gold columns. A predicted column is a candidate for a gold column only if
    it holds the same values (in order when `ordered`, else as a multiset); unordered, each new
    pairing must also keep the multiset of value pairs with the previous column. Identical
    predicted columns are interchangeable, so only one of each is tried. At most `limit`
    pairings are tried.
    """
    gold_cols = list(zip(*gold_rows, strict=False))
    pred_cols = list(zip(*pred_rows, strict=False))
    first: dict[tuple, int] = {}
    for j, col in enumerate(pred_cols):
        first.setdefault(col, j)
    copies = Counter(first[col] for col in pred_cols)
    if ordered:
        candidates = [[first[col]] if col in first else [] for col in gold_cols]
    else:
        by_values: dict[frozenset, list[int]] = {}
        for j in first.values():
            by_values.setdefault(_bag(pred_cols[j]), []).append(j)
        candidates = [by_values.get(_bag(col), []) for col in gold_cols]
    if not all(candidates):
        return

    def fits(i: int, j: int, perm: list[int]) -> bool:
        if ordered or i == 0:
            return True
        return Counter(zip(gold_cols[i - 1], gold_cols[i], strict=False)) == Counter(
            zip(pred_cols[perm[i - 1]], pred_cols[j], strict=False)
        )

    perm: list[int] = []
    stack = [iter(candidates[0])]
    tried = 0
    while stack:
        i = len(stack) - 1
        for j in stack[-1]:
            if copies[j] == 0 or not fits(i, j, perm):
                continue
            tried += 1
            if tried > limit:
                return
            perm.append(j)
            copies[j] -= 1
            if len(perm) == len(gold_cols):
                yield _spread(perm, pred_cols, first)
                copies[perm.pop()] += 1
                continue
            stack.append(iter(candidates[i + 1]))
            break
        else:
            stack.pop()
            if perm:
                copies[perm.pop()] += 1


def _bag(values) -> frozenset:
    return frozenset(Counter(values).items())


def _spread(perm: list[int], pred_cols, first) -> tuple[int, ...]:
    """Map a pairing over representative columns to distinct predicted column indices."""
    pool: dict[int, list[int]] = {}
    for j, col in enumerate(pred_cols):
        pool.setdefault(first[col], []).append(j)
    return tuple(pool[j].pop(0) for j in perm)
