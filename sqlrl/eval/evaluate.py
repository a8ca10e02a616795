"""Evaluation: generate SQL for every question that has a prompt, extract it, score it.

    metrics, predictions = evaluate_model(
        "models/sft", params.eval, params.seed,
        {"dev": "data/prepared/dev.jsonl", "heldout": "data/prepared/heldout.jsonl"},
        spider_dir="data/raw/spider")

- Rows whose database is absent (`prompt` null) are not generated for: they are predictions
  with status "skipped", ex/em null, counted in `skipped` (never scored as wrong).
- The model text goes through the answer path the server and TextToSQL share (sqlrl.answer:
  extract, schema repair, vote), then the shared scorer
  (`sqlrl.eval.score.score_predictions`: execution accuracy, exact match, hardness, verdicts).
- Schema repair (`eval.schema_repair`, `sqlrl/sql/schema_repair.py`): table and column names the
  database lacks are mapped onto its own before scoring; the model's unrepaired SQL is kept
  in the prediction row as `before_repair`, and `repaired` counts the changed predictions.
- The answer format: each model is asked in the format its folder records (sqlrl_prompt.json's
  `rollout`; none, as models/base: `sql`), through its Format (sqlrl/formats/): its system
  prompt in place of prepare's, its inference loop (for `agent` the tool loop on each
  question's database) and its extractor. `reasoning` and `agent` add their metrics to
  the split's (`rollout`; reasoning: mean_format_reward, no_answer_share; agent: episodes,
  tool_calls_per_episode, turns_per_episode, failed_tool_call_share, no_answer_share), and an
  agent's prediction rows carry the `trace` (each probe's query and observation, the final
  SQL). The `sql` format's files are byte for byte what they were before formats existed.
- Schema-constrained decoding (`eval.constrained`; the `sql` format, and the `reasoning`
  format's answer span: its Format's `answer_grammar`; docs/grammar.md): each question
  decodes under its own database's grammar (sqlrl/sql/grammar.py), built from
  the same tables file as its prompt, so that every table and column name it writes is one
  of that database's. A question whose schema yields no grammar decodes unconstrained in its
  batch, its reason logged and counted.
- Self-consistency (`eval.num_samples` > 1): N completions sampled per question at
  `eval.temperature` (seeded), each executed read-only; the answer is a query from the largest
  group of candidates with the same result (ties: the group seen first), as in SQL-R1 and
  OmniSQL (results compared the way EX compares them). Candidates that fail to execute get no
  vote; if none runs, the first is kept.

Metrics per split: ex, em, ex_all (EX over every question, the skipped ones counted as wrong:
correct / (n + skipped), the denominator of published Spider numbers), ex_nontrivial (EX
without the n_trivial_gold questions whose gold result is empty or only 0/NULL, which wrong
queries match easily), n (scored), skipped, by_hardness (each level with ex_all too),
soft_f1 (BIRD-format sets: BIRD mini_dev's Soft-F1, also per difficulty),
failures (sql_error, timeout: predictions that did not run; not "error", a key DVC reads as a
failed metrics file),
executable (share of scored predictions that ran without error), generation_seconds,
examples_per_second, repaired (with schema repair), absent_identifier_share (every run: the
share of answers, before schema repair, that name a table or column their database lacks;
sqlrl/sql/identifiers.py) with absent_identifier_rows and unparsed_share, and with
eval.constrained `constrained` (grammar_rows, fallback_rows, fallback_reasons, unfinished,
dead_ends, compile_seconds: `_grammar_metrics`). Each split's metrics are under its name
({"dev": {...}, "heldout": {...}}; a split other than dev without rows is left out), next to
"generation" (the decoding settings used). `headline` picks the few numbers DVC's default
views show.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlrl.benchmarks import level_report_keys
from sqlrl.benchmarks.base import Benchmark
from sqlrl.benchmarks.spider import SPIDER
from sqlrl.data.prompt_settings import AnswerFormat, read_answer_format
from sqlrl.errors import PipelineError
from sqlrl.eval.voting import vote_answers, votes_of
from sqlrl.formats import get_format
from sqlrl.jsonio import read_jsonl
from sqlrl.sql.judge import default_workers

log = logging.getLogger(__name__)

PRIMARY_SPLIT = "dev"
# failures in the metrics: the scorer's verdict names, but no key `error` (DVC reads one as a
# metrics file it failed to load)
FAILURE_KINDS = {"sql_error": "error", "timeout": "timeout"}
EVAL_ROW_KEYS = ("question", "gold", "db_id", "prompt")  # what prepare writes for a split


# --------------------------------------------------------------------------- one split


class DatabaseFileError(PipelineError):
    """A Spider database file is present but cannot be read."""


class ConstrainedFormatError(PipelineError):
    """eval.constrained asked of a model whose answer format the grammar does not cover."""


def check_constrained_format(answer_format: AnswerFormat, model: object = "the model") -> None:
    """ConstrainedFormatError unless the format builds a grammar of its answers around the
    query's (`grammar_constrained`: sql, reasoning's answer span); the agent's query is a tool
    call's argument, which it does not reach."""
    if not get_format(answer_format.rollout).grammar_constrained:
        raise ConstrainedFormatError(
            f"eval.constrained: {model} answers in the {answer_format.rollout!r} format, "
            "whose query the grammar does not reach (a tool call's argument); it covers the "
            "`sql` and `reasoning` formats (docs/grammar.md)"
        )


def check_gold_databases(rows: list[dict], items: list[dict]) -> None:
    """Raise DatabaseFileError when a gold query failed because its database file cannot be
    read (damaged, truncated, not SQLite): every question on it would score as wrong without a
    word. A gold query that fails on a readable database stays counted in `gold_failed`."""
    from sqlrl.sql.executor import SQLExecutor

    failed = {
        row["db_id"]: row["db_path"]
        for row, item in zip(rows, items, strict=False)
        if item.get("gold_failed")
    }
    executor = SQLExecutor()
    for db_id in sorted(failed):
        path = Path(failed[db_id])
        probe = executor.execute(path, "SELECT count(*) FROM sqlite_master")
        if not probe.ok:
            raise DatabaseFileError(
                f"{path}: gold queries fail because the database cannot be read "
                f"({probe.error}); restore it with `dvc checkout`"
            )


@dataclass
class Answers:
    """The model's answers to the questions of one split that have a prompt, in prompt order."""

    outputs: list[str]  # the model's text (with voting: the winning sample's)
    sqls: list[str]  # the SQL that is scored (extracted, repaired with schema repair)
    unrepaired: list[str]  # with schema repair: the SQL before it; otherwise empty
    votes: list[int] | None  # with voting: the winning group's size
    seconds: float  # generation wall time
    traces: list[dict] | None = None  # agent format: each answer's probes and final SQL
    stats: dict = field(default_factory=dict)  # the format's own metrics (none for sql)


def _picked(samples, db_paths, num_samples: int, fix, benchmark: Benchmark, extract) -> list:
    """Each question's Answer from its texts: one greedy text extracted and repaired, or
    several voted on by execution result."""
    from sqlrl.answer import finish_answer

    if num_samples > 1:
        return vote_answers(samples, db_paths, fix=fix, benchmark=benchmark, extract=extract)
    return [
        finish_answer(
            texts,
            repair=(lambda sql, k=k: fix(k, sql)) if fix is not None else None,
            extract=extract,
        )
        for k, texts in enumerate(samples)
    ]


def _collected(answers: list, num_samples: int, fix, seconds: float) -> Answers:
    return Answers(
        [a.completion for a in answers],
        [a.sql for a in answers],
        [a.extracted for a in answers] if fix is not None else [],
        [votes_of(answer) for answer in answers] if num_samples > 1 else None,
        seconds,
    )


def answer_questions(
    messages: list[list[dict]],
    db_paths: list[str],
    loop,
    answer_format,
    *,
    num_samples: int,
    temperature: float,
    seed: int,
    fix: Callable[[int, str], str] | None,
    benchmark: Benchmark = SPIDER,
    grammars: list | None = None,
) -> Answers:
    """The answers to `messages` (each in the model's format): `loop`, the format's inference
    loop (plain generation, or the agent's tool loop on each question's database), gives
    num_samples samples per question (greedy for one), and they go through the answer path
    the server and TextToSQL share (sqlrl.answer) with the format's extractor: greedy
    (extract, then repair) or, with num_samples > 1, repair every candidate and vote by
    execution result (grouped by the `benchmark`'s rule). A tool loop's chosen episode's
    trace goes with its answer; the format adds its metrics (`stats`). `grammars`: one per
    question for a generator that decodes under a grammar (eval.constrained, a plain loop)."""
    if not messages:
        return Answers([], [], [], None, 0.0)
    start = time.perf_counter()
    sampled = temperature if num_samples > 1 else 0.0  # one answer: greedy
    constrained = {} if grammars is None else {"grammars": grammars}
    asked = loop.ask(
        messages, db_paths, n=num_samples, temperature=sampled, seed=seed, **constrained
    )
    seconds = time.perf_counter() - start
    samples = [question.texts for question in asked]
    answers = _picked(samples, db_paths, num_samples, fix, benchmark, answer_format.extract)
    collected = _collected(answers, num_samples, fix, seconds)
    traces = [q.trace(a.chosen, a.sql) for q, a in zip(asked, answers, strict=True)]
    collected.traces = traces if any(t is not None for t in traces) else None
    collected.stats = answer_format.metrics(asked, collected.outputs)
    return collected


@dataclass
class Asker:
    """How a model is asked: its generator, how messages become its prompt text, its
    answer format and, for the agent, its tokenizer (the tool loop renders every turn)."""

    generator: object
    render: Callable[[list[dict]], str]
    answer_format: AnswerFormat = AnswerFormat()
    tokenizer: object = None

    def __post_init__(self):
        self.format = get_format(self.answer_format.rollout)
        self.loop = self.format.inference_loop(
            self.generator,
            render=self.render,
            tokenizer=self.tokenizer,
            answer_format=self.answer_format,
        )

    def answer(self, messages: list[list[dict]], db_paths: list[str], **decode) -> Answers:
        """The answers to prepare's `messages` (each put in the model's format first)."""
        messages = [self.format.prompt(m) for m in messages]
        return answer_questions(messages, db_paths, self.loop, self.format, **decode)


def _schema_fixer(rows: list[dict], todo: list[int], schemas: dict):
    """eval.schema_repair's repairer for the questions in `todo` (index -> SQL -> SQL)."""
    from sqlrl.sql.schema_repair import repairer

    return repairer(schemas, [rows[i]["db_id"] for i in todo], [rows[i]["question"] for i in todo])


@dataclass
class RowGrammars:
    """eval.constrained's grammar for each question of a split (None: unconstrained) and what
    building them cost: the fallbacks' reasons per question, the seconds spent compiling."""

    grammars: list
    fallback_reasons: Counter
    compile_seconds: float


NO_GRAMMARS = RowGrammars([], Counter(), 0.0)  # a split without a question to ask


def row_grammars(
    generator, db_ids: list[str], schemas: dict, tables_json, compose=None
) -> RowGrammars:
    """Each question's grammar from its database's schema (`schemas`: the tables file its
    prompt was built from), built once per database by the generator (`grammar_for`: the
    compiled grammar for transformers, the text for vLLM). A database without a schema in
    the file, or whose schema yields no grammar (GrammarUnavailable: a name SQL cannot
    write, no xgrammar), gets None: its questions decode unconstrained, the reason logged
    once per database and counted per question. `compose`: the answer format's template
    around the query (its Format's `answer_grammar`; None: the query is the answer)."""
    from sqlrl.sql.grammar import GrammarUnavailable

    grammar_for = getattr(generator, "grammar_for", None)
    if grammar_for is None:
        raise PipelineError(
            f"eval.constrained: the generator {type(generator).__name__} cannot decode under a "
            "grammar (it has no grammar_for)"
        )
    built: dict[str, tuple[object, str | None]] = {}
    seconds = 0.0
    for db_id in dict.fromkeys(db_ids):
        schema = schemas.get(db_id)
        start = time.perf_counter()
        if schema is None:
            built[db_id] = (None, f"no schema for the database in {Path(tables_json).name}")
        else:
            try:
                built[db_id] = (grammar_for(schema, compose), None)
            except GrammarUnavailable as exc:
                built[db_id] = (None, str(exc))
        seconds += time.perf_counter() - start
        reason = built[db_id][1]
        if reason is not None:
            log.warning(
                "no grammar for database %r, its %d question(s) decode unconstrained: %s",
                db_id,
                db_ids.count(db_id),
                reason,
            )
    reasons = Counter(built[d][1] for d in db_ids if built[d][1] is not None)
    return RowGrammars([built[d][0] for d in db_ids], reasons, seconds)


def _grammar_metrics(
    built: RowGrammars,
    outputs: list[str],
    sqls: list[str],
    row_schemas: list,
    dead_ends: int | None,
    compose=None,
) -> dict:
    """eval.constrained's counts for one split: questions decoded under a grammar, those that
    fell back (and why), the constrained answers the grammar does not accept as a whole
    query at their end (`unfinished`: cut at max_new_tokens, or a dead end), the finished ones
    that still name a table or column their database lacks (`finished_naming_absent`: 0 unless
    the grammar lets a name through that it should not; an unfinished answer may be cut
    mid-name), the dead ends the transformers backend saw (no token allowed, the answer ended
    there; None where the backend cannot tell: vLLM), and the seconds spent building grammars
    (a database compiled for an earlier split is not compiled again)."""
    from sqlrl.sql.grammar import accepts, matcher_for
    from sqlrl.sql.identifiers import absent_names

    constrained = [k for k, g in enumerate(built.grammars) if g is not None]
    matchers: dict = {}
    unfinished = naming_absent = 0
    for k in constrained:
        schema = row_schemas[k]
        if schema.db_id not in matchers:
            matchers[schema.db_id] = matcher_for(schema, compose)
        if accepts(outputs[k], matchers[schema.db_id]):
            naming_absent += bool(absent_names(sqls[k], schema))
        else:
            unfinished += 1
    return {
        "grammar_rows": len(constrained),
        "fallback_rows": len(built.grammars) - len(constrained),
        "fallback_reasons": dict(sorted(built.fallback_reasons.items())),
        "unfinished": unfinished,
        "finished_naming_absent": naming_absent,
        "dead_ends": dead_ends,
        "compile_seconds": round(built.compile_seconds, 3),
    }


EMPTY_REPORT = {
    "ex": None,
    "ex_all": None,
    "em": None,
    "n": 0,
    "skipped": 0,
    "by_hardness": {},
    "errors": {},
    "items": [],
}


def _score(
    rows: list[dict], preds: list[str], tables_json: str | Path, workers, benchmark: Benchmark
) -> dict:
    """The shared scorer's report on one split (every row, skipped ones included), by the
    `benchmark`'s rule."""
    from sqlrl.eval.score import score_predictions

    if not rows:
        return dict(EMPTY_REPORT)
    report = score_predictions(
        [(row["gold"], row["db_id"]) for row in rows],
        preds,
        None,
        tables_json,
        workers or default_workers(),
        benchmark=benchmark,
        db_paths=[row["db_path"] for row in rows],
        levels=[row.get(benchmark.level_key) for row in rows],
    )
    check_gold_databases(rows, report["items"])
    return report


def _prediction_rows(
    rows: list[dict], todo: list[int], answers: Answers, report: dict
) -> list[dict]:
    """One prediction row per input row, in input order (data/predictions/*.jsonl)."""
    position = {i: k for k, i in enumerate(todo)}  # row index -> its prompt's index
    predictions = []
    for i, (row, item) in enumerate(zip(rows, report["items"], strict=True)):
        k = position.get(i)
        skipped = k is None or item.get("status") == "skipped"
        pred = {
            "question": row["question"],
            "db_id": row["db_id"],
            "gold": row["gold"],
            "pred": answers.sqls[k] if k is not None else None,
            "ex": None if skipped else item.get("ex"),
            "em": None if skipped else item.get("em"),
            "hardness": item.get("hardness"),
            "status": "skipped" if skipped else item.get("status"),
            # skipped: the repo-relative path, so the file is the same on every machine
            "error": (
                f"database absent: {row.get('db_path') or row['db_id']}"
                if skipped
                else item.get("error") or ""
            ),
            "output": answers.outputs[k] if k is not None else None,
        }
        if answers.traces is not None and k is not None:
            pred["trace"] = answers.traces[k]
        if item.get("gold_trivial") and not skipped:
            pred["gold_trivial"] = True
        if answers.votes is not None and k is not None:
            pred["votes"] = answers.votes[k]
        if answers.unrepaired and k is not None and answers.unrepaired[k] != answers.sqls[k]:
            pred["before_repair"] = answers.unrepaired[k]
        for key in ("difficulty", "format"):  # what a benchmark set's scoring needs
            if key in row:
                pred[key] = row[key]
        predictions.append(pred)
    return predictions


def _split_metrics(
    predictions: list[dict], report: dict, answers: Answers, n_prompts: int, num_samples: int
) -> dict:
    seconds = answers.seconds
    scored = [p for p in predictions if p["status"] != "skipped"]
    n = len(scored)
    return {
        "ex": report["ex"],
        "em": report["em"],
        "n": n,
        # skipped questions counted as wrong: comparable with published Spider numbers
        "ex_all": report["ex_all"],
        "ex_nontrivial": report.get("ex_nontrivial"),
        "n_trivial_gold": report.get("n_trivial_gold", 0),
        **({"soft_f1": report["soft_f1"]} if "soft_f1" in report else {}),  # BIRD's rule
        "skipped": len(predictions) - n,
        **{key: report[key] for key in level_report_keys() if key in report},
        "failures": {k: report["errors"].get(v, 0) for k, v in FAILURE_KINDS.items()},
        "gold_failed": report.get("gold_failed", 0),
        "executable": round(sum(p["status"] == "ok" for p in scored) / n, 4) if n else None,
        "generation_seconds": round(seconds, 3),
        "examples_per_second": round(n_prompts / seconds, 3) if n_prompts and seconds else None,
        "num_samples": num_samples,
    }


def evaluate_split(
    rows: list[dict],
    generator,
    render: Callable[[list[dict]], str],
    *,
    tables_json: str | Path,
    benchmark: Benchmark = SPIDER,
    vote_samples: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
    schema_repair: bool = False,
    workers: int | None = None,
    answer_format: AnswerFormat | None = None,
    tokenizer=None,
    constrained: bool = False,
) -> tuple[dict, list[dict]]:
    """Generate greedily, extract, (repair,) score one split by its `benchmark`'s rule:
    (metrics, prediction rows in input order). With vote_samples k > 1, also sample k answers
    per question and vote by result: maj@k goes next to greedy, in `maj` and in each row.
    `answer_format`: the model's (default `sql`); the agent's needs the `tokenizer`.
    `constrained`: each question decodes under its database's grammar (`row_grammars`)."""
    from sqlrl.data.spider import load_schemas
    from sqlrl.sql.identifiers import absent_identifier_stats

    answer_format = answer_format or AnswerFormat()
    compose = None
    if constrained:
        check_constrained_format(answer_format)
        compose = get_format(answer_format.rollout).answer_grammar
    todo = [i for i, row in enumerate(rows) if row.get("prompt") and row.get("db_present", True)]
    schemas = load_schemas(Path(tables_json)) if todo else {}
    row_schemas = [schemas.get(rows[i]["db_id"]) for i in todo]
    fix = _schema_fixer(rows, todo, schemas) if schema_repair else None
    tokens_before = getattr(generator, "generated_tokens", None)
    asker = Asker(generator, render, answer_format, tokenizer) if todo else None
    messages = [rows[i]["prompt"] for i in todo]
    db_paths = [rows[i]["db_path"] for i in todo]
    built = None
    decode = dict(temperature=temperature, seed=seed, fix=fix, benchmark=benchmark)
    if constrained:  # no question to ask: no generator either
        db_ids = [rows[i]["db_id"] for i in todo]
        built = (
            row_grammars(generator, db_ids, schemas, tables_json, compose) if todo else NO_GRAMMARS
        )
        decode["grammars"] = built.grammars
    dead_ends_before = getattr(generator, "grammar_dead_ends", None)
    answers = (
        asker.answer(messages, db_paths, num_samples=1, **decode)
        if asker
        else Answers([], [], [], None, 0.0)
    )
    report = _score(rows, _in_row_order(rows, todo, answers), tables_json, workers, benchmark)
    predictions = _prediction_rows(rows, todo, answers, report)
    metrics = _split_metrics(predictions, report, answers, len(todo), 1)
    metrics.update(answers.stats)
    # the model's own SQL: what schema repair (when on) is given, not what it made of it
    metrics.update(absent_identifier_stats(answers.unrepaired or answers.sqls, row_schemas))
    if built is not None:
        dead_ends = None
        if dead_ends_before is not None:
            dead_ends = generator.grammar_dead_ends - dead_ends_before
        metrics["constrained"] = _grammar_metrics(
            built,
            answers.outputs,
            answers.unrepaired or answers.sqls,
            row_schemas,
            dead_ends,
            compose,
        )
    if fix is not None:
        metrics["repaired"] = sum(
            "before_repair" in p for p in predictions if p["status"] != "skipped"
        )
    if tokens_before is not None and answers.seconds:
        tokens = generator.generated_tokens - tokens_before
        metrics["generated_tokens"] = tokens
        metrics["tokens_per_second"] = round(tokens / answers.seconds, 1)
    if vote_samples > 1:
        voted = (
            asker.answer(messages, db_paths, num_samples=vote_samples, **decode)
            if asker
            else Answers([], [], [], None, 0.0)
        )
        maj = _score(rows, _in_row_order(rows, todo, voted), tables_json, workers, benchmark)
        metrics["maj"] = _majority_metrics(maj, voted, vote_samples)
        _add_majority(predictions, todo, voted, maj)
    return metrics, predictions


def _in_row_order(rows: list[dict], todo: list[int], answers: Answers) -> list[str]:
    """The answers' SQL at their rows' places; "" where a row got no prompt."""
    preds = [""] * len(rows)
    for k, i in enumerate(todo):
        preds[i] = answers.sqls[k]
    return preds


def _majority_metrics(report: dict, voted: Answers, k: int) -> dict:
    """maj@k of one split: the voted answers' EX, next to the greedy metrics."""
    return {
        "k": k,
        "ex": report["ex"],
        "ex_all": report["ex_all"],
        "ex_nontrivial": report.get("ex_nontrivial"),
        **({"soft_f1": report["soft_f1"]} if "soft_f1" in report else {}),
        **{key: report[key] for key in level_report_keys() if key in report},
        "generation_seconds": round(voted.seconds, 3),
    }


def _add_majority(predictions: list[dict], todo: list[int], voted: Answers, report) -> None:
    """Each prediction row gets its voted SQL, whether it scored, and its votes."""
    for k, i in enumerate(todo):
        item = report["items"][i]
        predictions[i]["maj_pred"] = voted.sqls[k]
        predictions[i]["maj_ex"] = None if item.get("status") == "skipped" else item.get("ex")
        predictions[i]["votes"] = voted.votes[k]


# --------------------------------------------------------------------------- a model


@dataclass(frozen=True)
class Split:
    """One split to evaluate: its rows (JSONL), the tables file of its schemas, and the
    benchmark family whose rule scores it (sqlrl.benchmarks)."""

    rows: str | Path
    tables_json: str | Path
    benchmark: Benchmark = SPIDER
    required: bool = False  # dev: an absent file is an error; another split may be empty


def spider_splits(dev: str | Path, heldout: str | Path, spider_dir: str | Path) -> dict:
    """Spider dev and the held-out training questions, as prepare writes them."""
    tables = Path(spider_dir) / "tables.json"
    return {
        PRIMARY_SPLIT: Split(dev, tables, required=True),
        "heldout": Split(heldout, tables),
    }


def evaluate_model(
    model_dir: str | Path,
    params,
    seed: int,
    splits: dict[str, Split | str | Path],
    *,
    spider_dir: str | Path | None = None,
    vote: bool = False,
    generator=None,
    render: Callable[[list[dict]], str] | None = None,
    workers: int | None = None,
    progress: bool = True,
    tokenizer=None,
) -> tuple[dict, dict[str, list[dict]]]:
    """Evaluate one model on each split. `params` is the `eval` section (EvalParams); with
    `vote`, maj@eval.num_samples is reported next to greedy.

    A split given as a plain path is a Spider split whose schemas are `spider_dir`'s (dev
    required). Returns (metrics, predictions per split): each split's metrics under its name
    (a required split always, another only when it has rows). `generator`/`render` replace the
    model (tests, or a caller that already holds one; an agent-format model's also needs its
    `tokenizer`); otherwise `make_generator` loads model_dir. The model is asked in the
    answer format its folder records (read_answer_format: `sql` without one); with
    eval.constrained that format must be one the grammar covers (`sql`), else
    ConstrainedFormatError before the model loads.
    """
    splits = {name: _as_split(name, split, spider_dir) for name, split in splits.items()}
    data = {
        name: read_jsonl(split.rows, EVAL_ROW_KEYS, missing_ok=not split.required)
        for name, split in splits.items()
    }
    answer_format = read_answer_format(model_dir)  # a bad record stops here, before loading
    if params.constrained:  # before the model loads
        check_constrained_format(answer_format, model_dir)
    if generator is None and any(row.get("prompt") for rows in data.values() for row in rows):
        generator, render, tokenizer = _load_generator(model_dir, params, seed, progress, render)
    if generator is not None and render is None:
        raise ValueError("a generator passed in needs its `render` (messages -> prompt text)")

    k = params.num_samples if vote else 1
    metrics: dict = {}
    predictions: dict[str, list[dict]] = {}
    for name, rows in data.items():
        if generator is not None and hasattr(generator, "desc"):
            generator.desc = f"{Path(model_dir).name} {name}"
        split = splits[name]
        split_metrics, predictions[name] = evaluate_split(
            rows,
            generator,
            render,
            tables_json=split.tables_json,
            benchmark=split.benchmark,
            vote_samples=k,
            temperature=params.temperature,
            seed=seed,
            schema_repair=params.schema_repair,
            workers=workers,
            answer_format=answer_format,
            tokenizer=tokenizer,
            constrained=params.constrained,
        )
        if split.required or rows:
            metrics[name] = split_metrics
    if generator is not None:
        from sqlrl.model.generate import decoding_summary

        metrics["generation"] = decoding_summary(generator, params.temperature, 1)
        if k > 1:
            metrics["generation_maj"] = decoding_summary(generator, params.temperature, k)
    return metrics, predictions


def _as_split(name: str, split: Split | str | Path, spider_dir: str | Path | None) -> Split:
    if isinstance(split, Split):
        return split
    if spider_dir is None:
        raise ValueError(f"split {name!r} is a path: give spider_dir (its tables.json) too")
    return Split(split, Path(spider_dir) / "tables.json", required=name == PRIMARY_SPLIT)


def _load_generator(model_dir, params, seed: int, progress: bool, render):
    """(generator, render, tokenizer) for the model in model_dir, as eval params ask."""
    from sqlrl.data.prompts import render_prompt
    from sqlrl.model.generate import make_generator

    generator, tokenizer = make_generator(
        model_dir,
        use_vllm=params.use_vllm,
        batch_size=params.batch_size,
        max_new_tokens=params.max_new_tokens,
        seed=seed,
        progress=progress,
        setting="eval.use_vllm",
    )
    return generator, render or (lambda messages: render_prompt(tokenizer, messages)), tokenizer


HEADLINE_KEYS = ("ex", "em")  # per split, in `dvc metrics show` / `diff`
HEADLINE_GAINS = ("dev", "heldout")  # the splits whose gain over the baseline the headline shows


def headline(metrics: dict, baseline: str | None = None) -> dict:
    """The numbers a reviewer compares first, small enough for `dvc metrics show` to print in
    one screen: EX and EM per split and, against the previous model, the EX gain on Spider's
    dev and held-out splits (each evaluation set's gain, with every interval, is in the detailed
    metrics file next to it, `vs_<baseline>`: a column per set and model would not fit)."""
    out = {}
    for name, split in metrics.items():  # dev, heldout and each benchmark set
        if not (isinstance(split, dict) and "ex" in split and "n" in split):
            continue  # generation settings, comparisons
        out[name] = {k: split[k] for k in HEADLINE_KEYS if split.get(k) is not None}
        if "maj" in split:
            out[name]["maj"] = split["maj"]["ex"]
    compared = metrics.get(f"vs_{baseline}") if baseline else None
    if compared:
        out["gain"] = {
            split: result["diff"] for split, result in compared.items() if split in HEADLINE_GAINS
        }
    return out
