"""Time the grammar per database against Qwen2.5's real tokenizer: compile once, then the cost
of each decoding step.

    python benchmarks/bench_grammar.py [--raw data/raw] [--threads 2]

For each Spider dev database (the 20 the dev questions use), then each BIRD dev database
present (3 of 11; the medians are the Spider ones): the grammar's size, the time to
compile it for Qwen2.5's 151,665 tokens (sqlrl.sql.grammar.compiled_grammar's first call,
time.perf_counter), the compiled grammar's memory, and, over that database's dev gold
queries tokenised as the model would write them (those the grammar accepts), the time per token of one decoding step
(`fill_next_token_bitmask` then `accept_token`, as xgrammar's HF logits processor and vLLM
do). Then the same compile with names and keywords listed as three spellings (as written,
lower, upper) instead of one character class per letter ([sS][eE]...), the alternative the
grammar does not use: it accepts fewer queries than SQLite does, and this shows whether it
would at least compile faster. docs/grammar.md quotes a run of this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root

from sqlrl.benchmarks.sets import load_set  # noqa: E402
from sqlrl.data.spider import load_examples, load_schemas  # noqa: E402
from sqlrl.params import load_params  # noqa: E402
from sqlrl.sql import grammar  # noqa: E402


def listed_spellings(text: str) -> str:
    """The alternative to one class per letter: the name as written, lower and upper case."""
    spellings = sorted({text, text.lower(), text.upper()})
    return "( " + " | ".join(grammar._literal(s) for s in spellings) + " )"


def compile_seconds(compiler, text: str) -> tuple[float, object]:
    import xgrammar

    start = time.perf_counter()
    compiled = compiler.compile_grammar(xgrammar.Grammar.from_ebnf(text))
    return time.perf_counter() - start, compiled


def step_seconds(compiled, token_lists: list[list[int]]) -> tuple[float, int]:
    """Seconds per decoding step over the queries' tokens, and the number of steps."""
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    steps = 0
    start = time.perf_counter()
    for tokens in token_lists:
        matcher = xgrammar.GrammarMatcher(compiled)
        for token in tokens:
            matcher.fill_next_token_bitmask(bitmask)
            if not matcher.accept_token(token):
                raise AssertionError(f"token {token} refused in a query the grammar accepts")
            steps += 1
        matcher.fill_next_token_bitmask(bitmask)  # the step that allows the stop token
        steps += 1
    return (time.perf_counter() - start) / steps, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", default="data/raw", help="the pulled data/raw folder")
    parser.add_argument("--threads", type=int, default=2, help="xgrammar's compile threads")
    args = parser.parse_args(argv)

    import xgrammar

    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    raw = Path(args.raw)
    schemas = load_schemas(raw / "spider" / "tables.json")
    dev = load_examples(raw / "spider" / "dev.json", schemas)
    bird_spec = load_params(Path(__file__).resolve().parents[1] / "params.yaml").eval.sets
    bird, bird_schemas, bird_dbs = load_set("bird_dev", bird_spec["bird_dev"], raw)
    bird = [e for e in bird if bird_dbs.path(e.db_id).is_file()]
    tokenizer = build_qwen25_tokenizer()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
    compiler = xgrammar.GrammarCompiler(info, max_threads=args.threads, cache_enabled=False)
    rows = []
    for benchmark, examples, known in (("spider", dev, schemas), ("bird", bird, bird_schemas)):
        for db_id in sorted({e.db_id for e in examples}):
            text = grammar.grammar_text(known[db_id])
            seconds, compiled = compile_seconds(compiler, text)
            matcher = grammar.matcher_for(known[db_id])
            queries = [e.query for e in examples if e.db_id == db_id]
            accepted = [q for q in queries if grammar.accepts(q, matcher)]
            tokens = [tokenizer.encode(q, add_special_tokens=False) for q in accepted]
            per_step, steps = step_seconds(compiled, tokens)
            rows.append(
                {
                    "benchmark": benchmark,
                    "db_id": db_id,
                    "tables": len(known[db_id].tables),
                    "grammar_chars": len(text),
                    "grammar_rules": text.count(" ::= "),
                    "compile_s": round(seconds, 3),
                    "compiled_mb": round(compiled.memory_size_bytes / 1e6, 2),
                    "step_ms": round(1000 * per_step, 3),
                    "steps": steps,
                    "queries": len(accepted),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    spider_rows = [row for row in rows if row["benchmark"] == "spider"]

    # the alternative spelling of names and keywords, compiled the same way
    one_class, grammar._any_case = grammar._any_case, listed_spellings
    grammar.grammar_text.cache_clear()
    try:
        listed = [
            compile_seconds(compiler, grammar.grammar_text(schemas[row["db_id"]]))[0]
            for row in spider_rows
        ]
    finally:
        grammar._any_case = one_class
        grammar.grammar_text.cache_clear()

    def median(key):
        return statistics.median(row[key] for row in spider_rows)

    summary = {
        "spider_dev_databases": len(spider_rows),
        "vocabulary": info.vocab_size,
        "threads": args.threads,
        "compile_s_median": round(median("compile_s"), 3),
        "compile_s_max": max(row["compile_s"] for row in spider_rows),
        "grammar_chars_median": median("grammar_chars"),
        "grammar_rules_median": median("grammar_rules"),
        "compiled_mb_median": round(median("compiled_mb"), 2),
        "step_ms_median": median("step_ms"),
        "step_ms_max_database": max(row["step_ms"] for row in rows),
        "steps": sum(row["steps"] for row in spider_rows),
        "listed_spellings_compile_s_median": round(statistics.median(listed), 3),
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
