"""Pull the SQL out of model text: the one function that reward, evaluation and serving share.

Models wrap their query in code fences, prefix it with `SQL:`, or put prose around it. Sharing
one extractor means a query is judged the same way in training, in evaluation and in serving.
Extraction only cuts text; it never repairs SQL. Whatever is not recognisably wrapped is
returned stripped as-is, so the executor, not the extractor, decides what is bad SQL
(stacked statements are kept together so that they fail there).
"""

from __future__ import annotations

import itertools
import re
import sqlite3

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S | re.I)
# ```lang\n body ``` (lang optional); an unclosed fence (a truncated generation) runs to the end.
_FENCE = re.compile(r"```[ \t]*(?:([\w+.-]+)[ \t]*\n|\n?)(.*?)(?:```|\Z)", re.S)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_LABEL = re.compile(
    r"^\s*(?:\*\*)?(?:final\s+)?(?:(?:sqlite|sql)(?:\s+query)?|query|answer)\s*(?:\*\*)?\s*:\s*"
    r"|^\s*(?:sqlite|sql)\s+(?=(?:select|with)\b)",
    re.I,
)
# A query starts with SELECT, or WITH followed by a CTE head (not the English "with").
_QUERY_HEAD = r"(?:select\b|with\s+(?:recursive\s+)?[\w\"`\[\]]+\s*(?:\([^()]*\)\s*)?as\s*\()"
# Other statements count only in capitals: "Update:" or "Create a query" is prose.
_STATEMENT_START = re.compile(
    r"\s*(?:\(|(?i:" + _QUERY_HEAD + r")|(?:VALUES|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|"
    r"ALTER|ATTACH|DETACH|PRAGMA|VACUUM|BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE|ANALYZE|"
    r"REINDEX|EXPLAIN)\b)"
)
_QUERY_START_LINE = re.compile(r"^[ \t]*" + _QUERY_HEAD, re.I | re.M)
_QUERY_START_UPPER = re.compile(
    r"\b(?:SELECT\b|WITH\s+(?:RECURSIVE\s+)?\S+\s*(?:\([^()]*\)\s*)?AS\s*\()"
)
_QUERY_START_ANY = re.compile(r"\b" + _QUERY_HEAD, re.I)
# Words that can begin a continuation line of a query; anything else after a blank line is prose.
_CONTINUATION = re.compile(
    r"\s*(?:[(),*'\"`\[]|--|/\*|(?:select|from|where|group|order|having|limit|offset|union|"
    r"intersect|except|join|inner|left|right|cross|natural|on|and|or|not|as|case|when|then|"
    r"else|end|with|values|asc|desc|by|in|exists|between|like|is|null|distinct|all)\b)",
    re.I,
)
_MAX_SEMICOLONS = 32  # cut points examined: plenty for real answers, bounded on huge input
# Characters sqlite3.complete_statement cannot take (it raises on NUL and on lone surrogates,
# which surrogateescape-decoded model text can hold); neither can end or quote a statement.
_UNCHECKABLE = re.compile(r"[\x00\ud800-\udfff]")
_PROSE_LINE = re.compile(
    r"\n[ \t]*(?:this|the|note|explanation|here|it|we|in this|these|that|above)\b[^\n]*", re.I
)


def completion_text(completion) -> str:
    """The text of a completion: a string, or a chat message list's last assistant content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in messages if m.get("role") == "assistant"]
        chosen = assistant or messages
        return _content_text(chosen[-1].get("content")) if chosen else ""
    return ""


def _content_text(content) -> str:
    """Message content is a string or a list of parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def extract_sql(text) -> str:
    """The SQL in `text` (a string or a chat message list), without fences, labels, prose or `;`.

    Takes any string (NULs, lone surrogates, control characters) and never raises: one odd
    completion must not fail the reward batch, the evaluation or the request it is in."""
    text = _THINK.sub("", completion_text(text))
    block = _fenced(text)
    if block is None:
        block = _inline(text)
    if block is None:
        block = _from_prose(text)
    return _tidy(block)


def _fenced(text: str) -> str | None:
    """The last SQL-tagged code block, else the last untagged one, else the last of any kind."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text) if body.strip()]
    if not blocks:
        return None
    for wanted in (lambda lang: "sql" in lang, lambda lang: lang == "", lambda lang: True):
        chosen = [body for lang, body in blocks if wanted(lang)]
        if chosen:
            return chosen[-1]
    return None


def _inline(text: str) -> str | None:
    """A single-backtick span that holds a query, as in "The query is `SELECT ...`."."""
    spans = [s for s in _INLINE.findall(text) if _QUERY_START_ANY.match(s.strip())]
    return spans[-1] if spans else None


def _from_prose(text: str) -> str:
    """The query inside unfenced text: from its first keyword to where prose resumes."""
    text = _after_label(text)
    if not _STATEMENT_START.match(text):
        start = None
        for pattern in (_QUERY_START_LINE, _QUERY_START_UPPER, _QUERY_START_ANY):
            found = pattern.search(text)
            if found:
                start = found.start()
                break
        if start is None:
            return text
        text = text[start:]
    return _cut_trailing_prose(text)


def _after_label(text: str) -> str:
    """The text after the last `SQL:`-style label line, if there is one."""
    labelled = [
        m.end()
        for m in re.finditer(
            r"(?:^|\n)[ \t]*(?:\*\*)?(?:final\s+)?(?:sqlite|sql)(?:\s+query)?\s*(?:\*\*)?\s*:",
            text,
            re.I,
        )
    ]
    return text[labelled[-1] :] if labelled else text


def _cut_trailing_prose(sql: str) -> str:
    """Cut at a `;` or a blank line that is followed by prose rather than more SQL."""
    for semicolon in itertools.islice(re.finditer(";", sql), _MAX_SEMICOLONS):
        i = semicolon.start()
        if _complete(sql[: i + 1]):
            rest = sql[i + 1 :]
            if rest.strip() and not _STATEMENT_START.match(rest) and not _is_comment(rest):
                sql = sql[: i + 1]
                break
    for blank in itertools.islice(re.finditer(r"\n[ \t]*\n", sql), _MAX_SEMICOLONS):
        rest = sql[blank.end() :]
        if not _CONTINUATION.match(rest) and not _STATEMENT_START.match(rest):
            sql = sql[: blank.start()]
            break
    prose = _PROSE_LINE.search(sql)
    return sql[: prose.start()] if prose else sql


def _complete(sql: str) -> bool:
    """sqlite3.complete_statement for any string: model text may hold NULs or lone surrogates."""
    return sqlite3.complete_statement(_UNCHECKABLE.sub(" ", sql))


def _is_comment(text: str) -> bool:
    return text.lstrip().startswith(("--", "/*"))


def _tidy(sql: str) -> str:
    """Strip whitespace, a leading `SQL:` label, wrapping backticks and trailing semicolons."""
    sql = sql.strip()
    sql = _LABEL.sub("", sql, count=1).strip()
    if len(sql) > 1 and sql.startswith("`") and sql.endswith("`") and "`" not in sql[1:-1]:
        sql = sql[1:-1].strip()
    return sql.rstrip("; \t\r\n")


_QUOTED_OR_SPACE = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`)|\s+")


def normalize_sql_whitespace(sql: str) -> str:
    """Collapse runs of whitespace to one space, leaving quoted literals untouched: the SQL
    of SFT's targets (sqlrl.data.prompts, and the reasoning format's <answer>). Here, with the
    other SQL text helpers, so sqlrl.formats needs nothing of sqlrl.data."""
    collapsed = _QUOTED_OR_SPACE.sub(lambda m: m.group(1) or " ", sql)
    return collapsed.strip()
