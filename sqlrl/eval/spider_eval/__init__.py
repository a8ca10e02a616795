"""Spider 1.0 exact set match (without values) and difficulty, as the official tools define them.

    from sqlrl.eval.spider_eval import exact_match, hardness
    exact_match(gold_sql, pred_sql, schema) -> bool   # schema: one raw tables.json entry
    hardness(sql, schema) -> "easy" | "medium" | "hard" | "extra"

SQL is parsed with sqlglot into the structure of Spider's official process_sql.py and
compared with the rules of test-suite-sql-eval's evaluation.py (the official Spider
evaluator): SQL the official reader cannot read is unreadable here too (lexer.py,
parse.py), and the comparison and difficulty rules keep its quirks (exact_match.py,
hardness.py). Parses and schema indexes are cached, so scoring a split takes well
under a second.
"""

from sqlrl.eval.spider_eval.exact_match import exact_match
from sqlrl.eval.spider_eval.hardness import hardness
from sqlrl.eval.spider_eval.lexer import SpiderParseError
from sqlrl.eval.spider_eval.parse import parse_sql

__all__ = ["SpiderParseError", "exact_match", "hardness", "parse_sql"]
