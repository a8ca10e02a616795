"""A grammar per database for schema-constrained decoding: the SQLite that Spider's and BIRD's
gold queries are written in, with table and column names restricted to one database's.

Why: a model's query that names a table or column the database lacks can only fail ("no such
column"). PICARD (Scholak et al., EMNLP 2021) constrains decoding so that every prefix stays a
valid query over the schema; here the constraint is a context-free grammar that xgrammar
(Dong et al. 2024) compiles against the tokenizer, so that each decoding step costs a token
mask rather than a parse per candidate. The same EBNF text goes to every decoding path:
transformers' `generate` through `xgrammar.contrib.hf.LogitsProcessor(compiled)`, and vLLM
(0.32, xgrammar backend) as `SamplingParams(structured_outputs=StructuredOutputsParams(
grammar=text))` or an OpenAI request's `structured_outputs={"grammar": text}`. The dialect is
the GBNF one vLLM's SQL example and xgrammar's `Grammar.from_ebnf` read: `name ::= ...`,
"literals", [character classes], ( ) | ? * +.

What the grammar covers (docs/grammar.md has the measured coverage of the gold queries):
- WITH (common table expressions), SELECT [DISTINCT|ALL], FROM with joins (comma, [NATURAL]
  [LEFT|RIGHT|FULL [OUTER]|INNER|CROSS] JOIN ... ON/USING), subqueries in FROM and in
  expressions, WHERE, GROUP BY / HAVING, UNION [ALL] / INTERSECT / EXCEPT, ORDER BY [ASC|DESC]
  [NULLS FIRST|LAST], LIMIT / OFFSET.
- Expressions: the SQLite operators, AND/OR/NOT, [NOT] LIKE/GLOB [ESCAPE], [NOT] BETWEEN,
  [NOT] IN (list or subquery), IS [NOT], ISNULL/NOTNULL, [NOT] EXISTS, CASE, CAST(x AS type),
  COLLATE NOCASE/BINARY/RTRIM, SQLite's built-in functions by name (FUNCTIONS: aggregates,
  the string, date and math functions BIRD's gold uses, window functions with OVER
  (PARTITION BY ... ORDER BY ...)).
- Keywords and names in any letter case (SQLite compares both case-insensitively; the grammar
  spells each letter as a class such as [sS]); whitespace (spaces, tabs, newlines) where SQL
  allows it and required between two words; an optional trailing semicolon.
- Literals are free: numbers, '...' strings ('' escapes), NULL, TRUE/FALSE, CURRENT_DATE...

Names (the constraint):
- A table is one of the database's tables: bare (where SQL allows the name unquoted), or in
  "...", `...` or [...] quotes.
- A bare column is one of the database's columns (any table's); after `table.` only that
  table's columns (or `*` as a result column); after an alias (`T1.`), any column of the
  database (a context-free grammar cannot know which table T1 stands for).
- Table aliases are of the form ALIAS_PATTERN (T, T1, t2, ...), declared with or without AS:
  what the gold queries use (every table alias of Spider, all but 4 queries' of BIRD dev). A
  qualifier (the part before the dot) is a table's name or such an alias, so that `x.col`
  with an arbitrary x is no way round the column restriction, and an alias written without
  AS cannot swallow a keyword (`FROM singer WHERE` must go on). Result-column aliases take
  any name, after AS (`count(*) AS cnt`); so do the names a WITH declares.
- A name the query declares is not a name of the database: referring to a result-column
  alias (`ORDER BY cnt`) or to a FROM subquery's column by it is refused unless it happens
  to be a column's name. A context-free grammar cannot know which names a query declares
  (a FROM subquery's aliases come after the SELECT list that uses them), and letting any
  name stand for a column would unconstrain every column position. The exception is WITH:
  the query says so at its first word, so its main query and its CTEs after the first take
  any names (the first CTE can only read the database). docs/grammar.md counts the gold
  queries these rules refuse.
- Free names cost decoding time: where any name may come next, xgrammar checks most of the
  vocabulary's word tokens one by one (about 0.1-0.3 s a step with Qwen2.5's 151,665 tokens
  on a CPU, against about 1 ms elsewhere), which is one more reason for the T<n> aliases.
- A double-quoted word where a value is expected (`name = "John"`, IN ("a", "b")), as
  Spider's gold writes string literals, is a string literal (SQLite reads an unknown
  double-quoted name as a string); the first operand of an expression (a result column, the
  left side of a comparison) cannot be one, so `SELECT "nosuchcolumn"` is refused.

Bad input: a schema without tables or columns, or a name that cannot be written in SQL (empty,
with a NUL or other control character), gives `GrammarUnavailable`, and so does an xgrammar
that is not installed (it is not in the default CPU install: docs/grammar.md); callers decode
unconstrained and log its reason (`grammar_or_none` does both).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import dataclass

from sqlrl.data.spider import Schema
from sqlrl.errors import PipelineError

log = logging.getLogger("sqlrl.grammar")

# a table alias (T, T1, t12): the gold queries' convention, and the qualifiers beside tables
ALIAS_PATTERN = "[tT] [0-9]*"
# SQLite's built-in functions that a query may call (core, aggregate, date, math, window).
FUNCTIONS = (
    # aggregate
    "avg count group_concat max min sum total string_agg "
    # core scalar
    "abs char coalesce concat concat_ws format glob hex ifnull iif instr length like "
    "likelihood likely lower ltrim nullif octet_length printf quote random randomblob replace "
    "round rtrim sign soundex substr substring trim typeof unhex unicode unlikely upper "
    "zeroblob "
    # date and time
    "date time datetime julianday unixepoch strftime timediff "
    # math
    "acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log "
    "log10 log2 mod pi pow power radians sin sinh sqrt tan tanh trunc "
    # window
    "row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value "
    "nth_value"
).split()
KEYWORDS = (
    "all and as asc between by case cast collate cross current_date current_time "
    "current_timestamp desc distinct else end escape except exists false filter first from "
    "full glob group having in inner intersect is isnull join last left like limit natural "
    "not notnull null nulls offset on or order outer over partition recursive right select "
    "then true union using when where with"
).split()
# a name SQLite reads unquoted: ASCII letters, digits, _ and $, or any non-ASCII character
BARE_NAME = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class GrammarUnavailable(PipelineError, ValueError):
    """The schema yields no grammar (no tables, a name SQL cannot write, a grammar xgrammar
    refuses); the message is the reason to log before decoding unconstrained."""


# --------------------------------------------------------------------------- text


def _literal(text: str) -> str:
    """An EBNF string literal of `text` (", \\ and control characters escaped)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _any_case(text: str) -> str:
    """EBNF for `text` in any ASCII letter case, as SQLite compares names and keywords:
    `Name` -> [nN] [aA] [mM] [eE]; runs of other characters stay one literal."""
    parts: list[str] = []
    run = ""
    for ch in text:
        if ch.isascii() and ch.isalpha():
            if run:
                parts.append(_literal(run))
                run = ""
            parts.append(f"[{ch.lower()}{ch.upper()}]")
        else:
            run += ch
    if run:
        parts.append(_literal(run))
    return " ".join(parts)


def _spellings(name: str, bare: bool) -> str:
    """Every way a query may write the identifier `name`: bare (where SQLite allows it),
    "quoted" ("" inside), `quoted` (`` inside), [quoted] (when the name has no ])."""
    forms = []
    if bare:
        forms.append(_any_case(name))
    forms.append('"\\"" ' + _any_case(name.replace('"', '""')) + ' "\\""')
    forms.append('"`" ' + _any_case(name.replace("`", "``")) + ' "`"')
    if "]" not in name:
        forms.append('"[" ' + _any_case(name) + ' "]"')
    return " | ".join(f"( {f} )" for f in forms)


def _check_name(name: object, what: str) -> None:
    """GrammarUnavailable for a name no query can write."""
    if not isinstance(name, str) or not name.strip():
        raise GrammarUnavailable(f"{what} has an empty name")
    if _CONTROL.search(name):
        raise GrammarUnavailable(f"{what} {name!r} has a control character SQL cannot write")


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _fold(name: str) -> str:
    """The key under which SQLite takes two names as one (ASCII case folded)."""
    return name.translate(_ASCII_LOWER)


def _bare_ok(name: str, position: str, sqlite) -> bool:
    """Whether SQLite reads `name` unquoted as a table or a column name (`position`): the
    bare-name pattern, and not a keyword SQLite reserves there, as SQLite's own parser says
    (the words it lets fall back to names vary by position and version: `FROM cast` parses,
    `SELECT cast` does not)."""
    if not BARE_NAME.fullmatch(name):
        return False
    quoted = '"' + name.replace('"', '""') + '"'
    probe = {
        "table": f"WITH {quoted} AS (SELECT 1 AS x) SELECT x FROM {name}",
        "column": f"WITH x AS (SELECT 1 AS {quoted}) SELECT {name} FROM x",
    }[position]
    try:
        sqlite.execute(probe)
    except sqlite3.Error:
        return False
    return True


# The database-independent part. `sp` is required whitespace (between two words), `ws`
# optional. The query rules are written once with `@` in the names of those that reach a
# table or column name, and instantiated twice: `@` -> "" (strict: the database's names) and
# `@` -> "_w" (the main query of a WITH, and the CTEs after the first, which may name the
# CTEs and their columns: `name_w`, `table_w` and `column_ref_w` take any name). Names of the
# database come in as `table`, `column` and `qualified` (table.column, alias.column).
_LEXICAL = r"""
root ::= ws query ws (";" ws)?
query ::= select_stmt
    | kw_with sp kw_recursive sp cte_w (ws "," ws cte_w)* ws select_stmt_w
    | kw_with sp cte (ws "," ws cte_w)* ws select_stmt_w
cte ::= cte_name sp kw_as ws "(" ws select_stmt ws ")"
cte_w ::= cte_name sp kw_as ws "(" ws select_stmt_w ws ")"
cte_name ::= alias_name (ws "(" ws alias_name (ws "," ws alias_name)* ws ")")?
compound_op ::= kw_union (sp kw_all)? | kw_intersect | kw_except
join_op ::= (kw_natural sp)? (join_kind sp)? kw_join
join_kind ::= (kw_left | kw_right | kw_full) (sp kw_outer)? | kw_inner | kw_cross
binary_op ::= "||" | "*" | "/" | "%" | "+" | "-" | "<<" | ">>" | "&" | "|"
    | "<=" | ">=" | "<" | ">" | "==" | "=" | "!=" | "<>"
type_name ::= type_word (sp type_word)* (ws "(" ws signed_number (ws "," ws signed_number)? ws ")")?
type_word ::= [A-Za-z_] [A-Za-z0-9_]*
literal ::= number | sq_string | kw_null | kw_true | kw_false
    | kw_current_date | kw_current_time | kw_current_timestamp
signed_number ::= ("-" | "+")? number
number ::= [0-9]+ ("." [0-9]*)? exponent? | "." [0-9]+ exponent? | "0" [xX] [0-9a-fA-F]+
exponent ::= [eE] [-+]? [0-9]+
sq_string ::= "'" ([^'] | "''")* "'"
dq_string ::= "\"" ([^"] | "\"\"")* "\""
alias_name ::= [A-Za-z_] [A-Za-z0-9_$]* | quoted_name
quoted_name ::= dq_name | "`" ([^`] | "``")+ "`" | "[" [^\]]+ "]"
dq_name ::= "\"" ([^"] | "\"\"")+ "\""
alias ::= ALIAS_PATTERN
alias_as ::= sp kw_as sp (alias_name | sq_string)
table_alias ::= sp (kw_as sp)? alias
table_alias_w ::= sp kw_as sp alias_name | sp alias
collation ::= [nN] [oO] [cC] [aA] [sS] [eE] | [bB] [iI] [nN] [aA] [rR] [yY]
    | [rR] [tT] [rR] [iI] [mM]
table_w ::= table | alias_name
column_ref_w ::= qualified | column | alias_name | alias_name "." alias_name
qualified_star ::= (table | alias) "." "*"
qualified_star_w ::= alias_name "." "*"
sp ::= [ \t\r\n]+
ws ::= [ \t\r\n]*
""".replace("ALIAS_PATTERN", ALIAS_PATTERN)
_QUERY = r"""
select_stmt@ ::= select_core@ (sp compound_op sp select_core@)* (sp order_by@)? (sp limit@)?
select_core@ ::= kw_select select_list@ (sp kw_from sp from_clause@)? (sp kw_where sp expr@)?
    (sp kw_group sp kw_by sp expr_list@ (sp kw_having sp expr@)?)?
select_list@ ::= (sp (kw_distinct | kw_all))? sp result@ (ws "," ws result@)*
    | sp (kw_distinct | kw_all) ws parenthesised@ tail@* alias_as? (ws "," ws result@)*
result@ ::= "*" | qualified_star@ | expr@ alias_as?
from_clause@ ::= table_item@ (join_tail@)*
table_item@ ::= table@ table_alias@?
    | "(" ws select_stmt@ ws ")" (ws kw_as sp alias | table_alias@)?
    | "(" ws from_clause@ ws ")"
join_tail@ ::= ws "," ws table_item@ | sp join_op sp table_item@ (sp join_constraint@)?
join_constraint@ ::= kw_on sp expr@
    | kw_using ws "(" ws column_ref@ (ws "," ws column_ref@)* ws ")"
order_by@ ::= kw_order sp kw_by sp order_item@ (ws "," ws order_item@)*
order_item@ ::= expr@ (sp (kw_asc | kw_desc))? (sp kw_nulls sp (kw_first | kw_last))?
limit@ ::= kw_limit sp expr@ ((ws "," ws | sp kw_offset sp) expr@)?
expr_list@ ::= expr@ (ws "," ws expr@)*
value_list@ ::= value@ (ws "," ws value@)*
expr@ ::= term@ tail@*
value@ ::= operand@ tail@*
tail@ ::= ws binary_op ws operand@ | sp word_tail@
word_tail@ ::= (kw_and | kw_or) sp operand@
    | (kw_not sp)? (kw_like | kw_glob) sp operand@ (sp kw_escape sp operand@)?
    | (kw_not sp)? kw_between sp operand@ sp kw_and sp operand@
    | (kw_not sp)? kw_in ws "(" ws (select_stmt@ | value_list@)? ws ")"
    | kw_is (sp kw_not)? sp operand@
    | kw_isnull | kw_notnull | kw_not sp kw_null
    | kw_collate sp collation
term@ ::= primary@ | closed@ word_tail@ | ("-" | "+" | "~") ws term@
    | kw_not sp term@ | kw_not ws parenthesised@
operand@ ::= term@ | dq_string
primary@ ::= literal | column_ref@ | case@ | closed@
closed@ ::= function_call@ | cast@ | exists@ | parenthesised@ | sq_string
parenthesised@ ::= "(" ws select_stmt@ ws ")" | "(" ws value@ (ws "," ws value@)* ws ")"
function_call@ ::= function ws "(" ws (function_args@ ws)? ")"
    (sp kw_filter ws "(" ws kw_where sp expr@ ws ")")? (sp kw_over ws "(" ws window@? ws ")")?
function_args@ ::= "*" | (kw_distinct sp)? value_list@ | kw_distinct ws parenthesised@
window@ ::= kw_partition sp kw_by sp expr_list@ (sp order_by@)? | order_by@
cast@ ::= kw_cast ws "(" ws value@ sp kw_as sp type_name ws ")"
case@ ::= kw_case (sp expr@)? (sp kw_when sp expr@ sp kw_then sp value@)+
    (sp kw_else sp value@)? sp kw_end
exists@ ::= kw_exists ws "(" ws select_stmt@ ws ")"
"""
_STRICT_NAMES = "column_ref ::= qualified | column\n"
_SQL = (
    _LEXICAL.strip()
    + "\n"
    + _QUERY.strip().replace("@", "")
    + "\n"
    + _QUERY.strip().replace("@", "_w")
    + "\n"
    + _STRICT_NAMES
)


@functools.lru_cache(maxsize=512)
def grammar_text(schema: Schema) -> str:
    """The EBNF (xgrammar's GBNF dialect, root rule `root`) of the queries over `schema`.

    Pure and deterministic: the same schema gives the same text, which is the compile cache's
    key (and this function's own cache: a Schema is immutable). GrammarUnavailable when the
    schema has no tables or columns, or a name SQL cannot write."""
    if not schema.tables:
        raise GrammarUnavailable(f"database {schema.db_id!r} has no tables")
    sqlite = sqlite3.connect(":memory:")
    try:
        return _grammar_text(schema, sqlite)
    finally:
        sqlite.close()


def _grammar_text(schema: Schema, sqlite) -> str:
    column_rules: dict[str, str] = {}  # folded column name -> its rule name
    column_lines: list[str] = []
    table_lines: list[str] = []
    qualified: list[str] = []
    seen_tables: set[str] = set()
    for table in schema.tables:
        _check_name(table.name, f"database {schema.db_id!r}: a table")
        if _fold(table.name) in seen_tables:
            continue  # SQLite holds one table per folded name; a second entry adds nothing
        seen_tables.add(_fold(table.name))
        own: list[str] = []
        for column in table.columns:
            _check_name(column.name, f"table {table.name!r}: a column")
            rule = column_rules.get(_fold(column.name))
            if rule is None:
                rule = column_rules[_fold(column.name)] = f"c{len(column_rules)}"
                spellings = _spellings(column.name, _bare_ok(column.name, "column", sqlite))
                column_lines.append(f"{rule} ::= {spellings}")
            if rule not in own:
                own.append(rule)
        rule = f"t{len(table_lines)}"
        table_lines.append(
            f"{rule} ::= {_spellings(table.name, _bare_ok(table.name, 'table', sqlite))}"
        )
        if own:
            qualified.append(f'( {rule} "." ( {" | ".join(own)} ) )')
    if not column_rules:
        raise GrammarUnavailable(f"database {schema.db_id!r} has no columns")
    tables = " | ".join(line.split(" ::= ")[0] for line in table_lines)
    all_columns = " | ".join(column_rules.values())
    lines = [
        f"# database {schema.db_id}: {len(table_lines)} tables, {len(column_rules)} column names",
        _SQL.strip(),
        f"table ::= {tables}",
        f"column ::= {all_columns}",
        "qualified ::= " + " | ".join([*qualified, f'( alias "." ( {all_columns} ) )']),
        "function ::= " + " | ".join(f"( {_any_case(f)} )" for f in FUNCTIONS),
        *(f"kw_{k} ::= {_any_case(k)}" for k in KEYWORDS),
        *table_lines,
        *column_lines,
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- compiled


def _xgrammar():
    """The xgrammar module, or GrammarUnavailable where it is not installed (requirements.txt
    has it; an environment of the user's own may not)."""
    try:
        import xgrammar
    except ImportError as exc:
        raise GrammarUnavailable(
            f"xgrammar is not installed ({exc}): pip install xgrammar==0.2.8"
        ) from None
    return xgrammar


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    size: int  # compiled grammars held


class _Cache:
    """Compiled grammars by (tokenizer, grammar text's sha256), least recently used dropped
    past `maxsize`. A compiled grammar holds the tokenizer's token masks (megabytes for a
    150k vocabulary), hence the bound. Thread-safe: the server compiles from request threads.
    The entry keeps its TokenizerInfo alive, so the id() in the key is not reused. A compile
    (about 0.2 s for a Spider database and Qwen2.5's vocabulary) holds the lock: a second
    request for the same database waits for it rather than compiling it again."""

    def __init__(self, maxsize: int = 256):
        self.maxsize = maxsize
        self.entries: OrderedDict[tuple[int, str], tuple[object, object]] = OrderedDict()
        self.compilers: dict[int, tuple[object, object]] = {}
        self.hits = self.misses = 0
        self.lock = threading.Lock()

    def compiler(self, tokenizer_info):
        held = self.compilers.get(id(tokenizer_info))
        if held is None or held[0] is not tokenizer_info:
            # xgrammar's own cache is off: this one is keyed and bounded as documented above
            compiler = _xgrammar().GrammarCompiler(tokenizer_info, cache_enabled=False)
            held = self.compilers[id(tokenizer_info)] = (tokenizer_info, compiler)
        return held[1]

    def get(self, text: str, tokenizer_info):
        xgrammar = _xgrammar()
        key = (id(tokenizer_info), hashlib.sha256(text.encode("utf-8")).hexdigest())
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None and entry[0] is tokenizer_info:
                self.entries.move_to_end(key)
                self.hits += 1
                return entry[1]
            self.misses += 1
            compiler = self.compiler(tokenizer_info)
            try:
                compiled = compiler.compile_grammar(xgrammar.Grammar.from_ebnf(text))
            except RuntimeError as exc:  # xgrammar's error for a grammar it cannot read
                raise GrammarUnavailable(
                    f"xgrammar refused the grammar: {str(exc).splitlines()[0][:300]}"
                ) from None
            self.entries[key] = (tokenizer_info, compiled)
            while len(self.entries) > self.maxsize:
                self.entries.popitem(last=False)
            return compiled


_CACHE = _Cache()


def hf_tokenizer_info(tokenizer, vocab_size: int, stop_token_ids):
    """xgrammar's TokenizerInfo of a transformers tokenizer, for `compiled_grammar`:
    `vocab_size` the model's embedding rows (config.vocab_size, which may exceed
    len(tokenizer)), `stop_token_ids` the tokens generation stops at (or the grammar never
    lets a query end). GrammarUnavailable where xgrammar is not installed."""
    return _xgrammar().TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
    )


def answer_text(schema: Schema, compose=None) -> str:
    """The EBNF a completion is decoded under: `schema`'s query grammar, or the whole answer
    `compose(query grammar)` makes of it (an answer format's template around the query, its
    Format's `answer_grammar`: sqlrl/formats/). GrammarUnavailable as `grammar_text`."""
    text = grammar_text(schema)
    return text if compose is None else compose(text)


def compiled_grammar(schema: Schema, tokenizer_info, compose=None):
    """The xgrammar CompiledGrammar of `schema`'s queries for a tokenizer
    (`xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model's)`), compiled once
    per process and database: the cache key is the grammar text's hash, so two schema objects
    with the same names share one entry. Hand it to `xgrammar.contrib.hf.LogitsProcessor`
    (one per generate call; a list gives one grammar per row) or to a GrammarMatcher.
    GrammarUnavailable (decode unconstrained, log the reason) when the schema yields none.
    `compose`: an answer format's template around the query (`answer_text`)."""
    return _CACHE.get(answer_text(schema, compose), tokenizer_info)


def cache_info() -> CacheInfo:
    """Hits, misses and entries of the compile cache, for tests and logs."""
    with _CACHE.lock:
        return CacheInfo(_CACHE.hits, _CACHE.misses, len(_CACHE.entries))


def checked_grammar_text(schema: Schema, compose=None) -> str:
    """`grammar_text(schema)` once xgrammar has read it (compiled against an empty vocabulary,
    milliseconds, cached): what vLLM gets, which compiles it itself inside the engine, where a
    grammar it cannot read would fail the request rather than fall back. GrammarUnavailable
    as `compiled_grammar` (`compose` too)."""
    text = answer_text(schema, compose)
    _CACHE.get(text, _string_tokenizer())
    return text


def grammar_or_none(schema: Schema, tokenizer_info=None, logger: logging.Logger = log):
    """The caller's fallback in one place: the compiled grammar (or, without a tokenizer, the
    EBNF text for vLLM), or None after logging why decoding goes unconstrained."""
    try:
        if tokenizer_info is None:
            return checked_grammar_text(schema)
        return compiled_grammar(schema, tokenizer_info)
    except GrammarUnavailable as exc:
        logger.warning("no grammar for database %r, decoding unconstrained: %s", schema.db_id, exc)
        return None


@functools.cache
def _string_tokenizer():
    """A TokenizerInfo without tokens: a matcher compiled with it matches text, not tokens
    (xgrammar's own tests match strings this way), and compiles in milliseconds."""
    return _xgrammar().TokenizerInfo([])


def matcher_for(schema: Schema, compose=None):
    """A GrammarMatcher of `schema`'s grammar (composed into an answer by `compose`) that
    matches strings (see `accepts`)."""
    compiled = _CACHE.get(answer_text(schema, compose), _string_tokenizer())
    return _xgrammar().GrammarMatcher(compiled, terminate_without_stop_token=True)


def accepts(sql: str, matcher) -> bool:
    """Whether the grammar of `matcher` (from `matcher_for`) accepts `sql` as a whole query:
    every character accepted and the root rule complete, so decoding could stop there. The
    matcher is reset first, so one serves a whole database's queries."""
    matcher.reset()
    return bool(matcher.accept_string(sql)) and matcher.is_completed()
