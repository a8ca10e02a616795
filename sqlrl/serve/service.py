"""The service behind the routes: one request's answer, without HTTP. `Service` holds the
configuration, the request input (sqlrl/request_input.py), the backend and the counters; it
checks a request's settings against the server's bounds, builds its prompt, generates through
the backend (with a deadline, 504, and a bounded queue, 503), extracts, repairs and votes, and
runs SQL read-only. DDL parsing and tokenization run in a small worker pool off the event loop.

The layers (none imports a layer above it): `config` (ServeConfig) -> `service` (this) ->
`http` (bodies, limits, the API key, error shapes) -> `routes/` (native, openai, playground)
-> `application` (create_app). Requests reach this module already parsed by `http.parse_body`
(size cap, read deadline, strict UTF-8, a strict pydantic model), so an input the server
cannot understand got a 4xx saying what is wrong before it got here.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import secrets
import time
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sqlrl.answer import Answer, candidate_sqls, schema_repair
from sqlrl.errors import PipelineError
from sqlrl.params import ParamsError, check_sampling
from sqlrl.request_input import InputError, RequestInput, check_constrained_format
from sqlrl.serve.backends import Busy, NotReady, make_backend
from sqlrl.serve.config import ServeConfig, prompt_settings_for
from sqlrl.serve.http_errors import (
    HTTPError,
    check_text,
)

log = logging.getLogger("sqlrl.serve")

# the lowest sampling temperature: below it logits / temperature overflow into NaN
# probabilities (vLLM clamps to the same 0.01); 0 means greedy
MIN_TEMPERATURE = 0.01
PREPARE_WORKERS = 2  # threads parsing DDL, tokenizing and repairing SQL, off the loop


class GenerateRequest(BaseModel):
    """POST /generate. Exactly one of schema_str, db_id, ddl."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: str
    schema_str: str | None = None
    db_id: str | None = None
    ddl: str | None = None
    execute: bool = False
    max_new_tokens: int | None = None
    temperature: float | None = None
    num_samples: int | None = None
    seed: int | None = None
    max_rows: int | None = None
    constrained: bool | None = None  # None: the server's --constrained


# --------------------------------------------------------------------------- JSON-safe rows


def _json_value(value):
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:  # text the executor decoded with surrogateescape
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(value, bytes):
        return "0x" + value[:64].hex() + ("..." if len(value) > 64 else "")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _json_rows(rows) -> list[list]:
    return [[_json_value(v) for v in row] for row in rows]


# --------------------------------------------------------------------------- bodies


def verdict_body(verdict) -> dict:
    """An execution verdict as JSON: status and error, and for a query that ran its columns,
    rows (JSON-safe) and whether they stop at the row limit; on a live database the SQL that
    ran (`executed_sql`: transpiled to its dialect)."""
    body = {
        "verdict": {"status": verdict.status, "error": verdict.error},
        "columns": list(verdict.columns) if verdict.columns is not None else None,
        "rows": _json_rows(verdict.rows) if verdict.rows is not None else None,
        "truncated": bool(verdict.truncated),
    }
    if verdict.executed_sql is not None:
        body["executed_sql"] = verdict.executed_sql
    return body


def connect_databases(config: ServeConfig, settings) -> list:
    """The live databases of --database and --database-file, connected and introspected
    (sqlrl/live/databases.py); a LiveDatabaseError (never showing a password) stops the start."""
    from sqlrl.live.databases import LiveLimits, connect, parse_named, read_database_file, redact

    entries = [parse_named(arg) for arg in config.database]
    if config.database_file:
        entries += read_database_file(config.database_file)
    limits = LiveLimits(timeout_s=config.exec_timeout_s, max_rows=config.max_rows)
    rows = settings.sample_rows if settings.schema_format == "ddl" else 0
    databases = []
    for name, url in entries:
        databases.append(connect(name, url, limits, sample_rows=rows))
        log.info("serve: live database %s at %s", name, redact(url))
    return databases


@dataclass
class Served:
    """What one request's answer path produced, for the route to shape its response."""

    answer: Answer  # the chosen SQL, every sample's SQL, the vote and the verdict
    texts: list[str]  # every completion, in sample order
    prompt_tokens: int
    generation_s: float
    opts: dict  # the settings it was generated with (settings_for)
    live: dict | None = None  # a live database's: {"dialect", "tables": kept, dropped, why}


def generate_body(req: GenerateRequest, served: Served) -> dict:
    """The /generate response: the chosen SQL and completion, an agent's trace, with several
    samples the vote and every candidate, with execution the verdict and rows, and the
    usage."""
    a = served.answer
    out = {"sql": a.sql, "completion": a.completion}
    if a.trace is not None:  # an agent model: its probes, their observations, the final SQL
        out["trace"] = a.trace
    if a.vote is not None:
        out.update(votes=a.votes, vote=a.vote)
    if served.opts["temperature"] > 0:  # sampled: the seed that reproduces it
        out["seed"] = served.opts["seed"]
    if len(a.candidates) > 1:
        out["num_samples"] = len(a.candidates)
        out["candidates"] = a.candidates
    if a.verdict is not None:
        out.update(verdict_body(a.verdict))
    if req.db_id is not None:
        out["db_id"] = req.db_id
    if served.live is not None:  # a live database: its dialect, the tables the prompt kept
        out["dialect"] = served.live["dialect"]
        out["schema_tables"] = served.live["tables"]
    out.update(constrained_body(served.opts))
    out["usage"] = {
        "prompt_tokens": served.prompt_tokens,
        "generation_seconds": round(served.generation_s, 4),
    }
    return out


def constrained_body(opts: dict) -> dict:
    """Where constrained decoding was asked for (the request's `constrained` or the server's
    --constrained): whether the answer was decoded under its schema's grammar and, when not,
    why (`unconstrained_reason`); nothing otherwise, so an unconstrained answer's body is
    what it was before the setting existed."""
    if not opts.get("constrained"):
        return {}
    if opts.get("grammar") is not None:
        return {"constrained": True}
    return {"constrained": False, "unconstrained_reason": opts.get("unconstrained_reason")}


# --------------------------------------------------------------------------- the app


class Service:
    """What the routes share: config, request input (prompts), backend, counters."""

    def __init__(self, config: ServeConfig, backend=None, prompt_settings=None):
        self.config = config
        self.backend = backend
        self.settings = prompt_settings or prompt_settings_for(config)
        self.prompts = RequestInput(
            self.settings, config.spider_dir or None, live_schema_chars=config.max_live_schema_chars
        )
        for database in connect_databases(config, self.settings):
            self.prompts.add_live(database)
        if config.constrained:  # a reasoning or agent model is refused now, not per request
            check_constrained_format(self.settings.rollout, "--constrained")
        self.started = time.time()
        self.counts = Counter()
        self.load_seconds = None
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._pool = ThreadPoolExecutor(PREPARE_WORKERS, thread_name_prefix="sqlrl-prepare")
        if self.backend is None:
            t0 = time.perf_counter()
            self.backend = await asyncio.to_thread(
                make_backend, self.config.model, self.config.backend_options()
            )
            self.load_seconds = round(time.perf_counter() - t0, 3)
            await self.backend.start()
            if self.config.warmup:
                await self._warmup()
        else:
            await self.backend.start()
        # the agent format refuses a chat template that cannot call tools now, not per request
        self.format.check_tokenizer(self.backend.tokenizer)
        # the model, tokenizer and schemas live as long as the server: without this, each full
        # collection walks them all, a 0.2-0.5 s pause of every thread (the event loop too)
        # whenever a request allocates many objects (sqlglot parsing DDL)
        gc.freeze()
        log.info("serve: %s backend ready for %s", self.backend.name, self.config.model)

    async def _warmup(self) -> None:
        from sqlrl.data.prompts import build_messages, render_prompt

        messages = build_messages("t | c", "warm up", self.settings.system_prompt)
        prompt = render_prompt(self.backend.tokenizer, messages)
        try:
            await asyncio.wait_for(
                self.backend.complete(prompt, max_new_tokens=2), self.config.request_timeout_s
            )
        except Exception as exc:  # noqa: BLE001 - a failed warm-up is not fatal; requests say more
            log.warning("serve: warm-up generation failed: %s: %s", type(exc).__name__, exc)

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ one request
    def settings_for(self, req: GenerateRequest) -> dict:
        """The generation settings of a request within the server's bounds (a 422 naming the
        field otherwise); what a request leaves out comes from the server's defaults."""
        c = self.config
        max_new = c.max_new_tokens if req.max_new_tokens is None else req.max_new_tokens
        if not 1 <= max_new <= c.max_new_tokens_limit:
            raise HTTPError(
                422,
                f"max_new_tokens must be between 1 and {c.max_new_tokens_limit}, got {max_new}",
                param="max_new_tokens",
            )
        n = 1 if req.num_samples is None else req.num_samples
        if not 1 <= n <= c.max_num_samples:
            raise HTTPError(
                422,
                f"num_samples must be between 1 and {c.max_num_samples}, got {n}",
                param="num_samples",
            )
        temperature = self.temperature_for(req.temperature, n)
        max_rows = c.max_rows if req.max_rows is None else req.max_rows
        if not 0 <= max_rows <= c.max_rows:
            raise HTTPError(
                422,
                f"max_rows must be between 0 and {c.max_rows}, got {max_rows}",
                param="max_rows",
            )
        seed = req.seed if req.seed is not None else c.seed
        if seed is None:  # as OpenAI's API: a regenerate varies unless the client sends a seed
            seed = secrets.randbelow(2**32)
        if not 0 <= seed < 2**32:
            raise HTTPError(422, f"seed must be between 0 and 2**32 - 1, got {seed}", param="seed")
        constrained = c.constrained if req.constrained is None else req.constrained
        if constrained:
            try:
                check_constrained_format(self.settings.rollout, "constrained")
            except PipelineError as exc:  # ConstrainedFormatError
                raise HTTPError(422, str(exc), param="constrained") from None
        return dict(
            max_new_tokens=max_new,
            n=n,
            temperature=temperature,
            seed=seed,
            max_rows=max_rows,
            constrained=constrained,
        )

    def grammar_for_request(self, req: GenerateRequest) -> tuple[object | None, str | None]:
        """(the grammar the request decodes under, None) or (None, why it decodes
        unconstrained): its parsed schema (db_id, ddl) through the backend's `grammar_for`
        (RequestInput.grammar; compiled once per database and process)."""
        grammar_for = getattr(self.backend, "grammar_for", None)
        return self.prompts.grammar(grammar_for, db_id=req.db_id, ddl=req.ddl)

    def temperature_for(self, asked: float | None, n: int) -> float:
        """0 (greedy) or MIN_TEMPERATURE..--max-temperature; unasked, greedy for one sample and
        --sample-temperature for several (greedy decoding gives one answer however often)."""
        if asked is None:
            return self.config.sample_temperature if n > 1 else 0.0
        temperature = float(asked)
        if not (
            math.isfinite(temperature)
            and (
                temperature == 0.0 or MIN_TEMPERATURE <= temperature <= self.config.max_temperature
            )
        ):
            raise HTTPError(
                422,
                f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE:g} "
                f"and {self.config.max_temperature:g}, got {asked}",
                param="temperature",
            )
        try:
            check_sampling(n, temperature, "num_samples", "temperature")
        except ParamsError as exc:
            raise HTTPError(422, str(exc), param="temperature") from None
        return temperature

    def check_request_text(self, req: GenerateRequest) -> str:
        """The question, NFC-normalised and stripped, once every text field is within its
        limit and valid Unicode and exactly one schema form is given."""
        c = self.config
        given = [k for k in ("schema_str", "db_id", "ddl") if getattr(req, k) is not None]
        if len(given) != 1:
            raise HTTPError(
                422,
                "give exactly one of schema_str, db_id or ddl"
                + (f" (got {', '.join(given)})" if given else ""),
            )
        check_text("question", req.question, c.max_question_chars)
        question = unicodedata.normalize("NFC", req.question).strip()
        if not question:
            raise HTTPError(422, "question is empty", param="question")
        for key, limit in (("schema_str", c.max_schema_chars), ("ddl", c.max_ddl_chars)):
            value = getattr(req, key)
            if value is not None:
                check_text(key, value, limit)
                if not value.strip():
                    raise HTTPError(422, f"{key} is empty", param=key)
        if req.db_id is not None:
            check_text("db_id", req.db_id, 128)
        if req.execute and req.db_id is None:
            raise HTTPError(
                422,
                "execute needs a db_id: only the server's databases (Spider's, and those "
                "connected with --database) can be queried",
                param="execute",
            )
        return question

    def check_prompt_length(self, prompt: str, max_new_tokens: int) -> int:
        """The prompt's tokens; a 413 past the tighter of --max-prompt-tokens and the context
        the backend reports (vLLM: the engine's max_model_len) minus max_new_tokens: vLLM
        refuses a longer prompt itself, and on its batch path one such prompt fails the batch."""
        limit, why = self.config.max_prompt_tokens, "the server's --max-prompt-tokens"
        context = getattr(self.backend, "context_length", None)
        if context and (not limit or context - max_new_tokens < limit):
            limit = context - max_new_tokens
            why = f"the model's context of {context} tokens minus max_new_tokens {max_new_tokens}"
        n_tokens = self.count_tokens(prompt)
        if limit and n_tokens > limit:
            raise HTTPError(
                413,
                f"the prompt is {n_tokens} tokens, over the limit of {limit} "
                f"({why}); shorten the schema or question",
            )
        return n_tokens

    def count_tokens(self, text: str) -> int:
        return len(self.backend.tokenizer(text, add_special_tokens=False)["input_ids"])

    def sqls_for(self, req: GenerateRequest, texts: list[str]) -> tuple[list[str], list[str]]:
        """(the SQL of each completion, the same before repair) through the answer path's
        first step (sqlrl.answer.candidate_sqls): extraction and, where the request's schema
        is known (db_id, ddl), its schema repair (eval.schema_repair)."""
        repair = self.settings.schema_repair
        schema = self.prompts.schema(db_id=req.db_id, ddl=req.ddl) if repair else None
        extract = self.format.extract  # the model's format's
        return candidate_sqls(texts, schema_repair(schema, req.question), extract)

    async def complete(self, prompt: str, opts: dict) -> list[str]:
        """The backend's completions within --request-timeout-s; its failures become the HTTP
        statuses a client can act on (504 late, 503 busy or not ready, 500 anything else)."""
        grammar = opts.get("grammar")  # passed only when there is one: the plain call unchanged
        constrained = {} if grammar is None else {"grammar": grammar}
        try:
            texts = await asyncio.wait_for(
                self.backend.complete(
                    prompt,
                    n=opts["n"],
                    temperature=opts["temperature"],
                    max_new_tokens=opts["max_new_tokens"],
                    seed=opts["seed"],
                    **constrained,
                ),
                timeout=self.config.request_timeout_s,
            )
        except TimeoutError:
            raise HTTPError(
                504, f"generation did not finish within {self.config.request_timeout_s:g} s"
            ) from None
        except (Busy, NotReady) as exc:
            raise HTTPError(503, str(exc)) from None
        except Exception:  # noqa: BLE001 - the model failed, the server does not
            log.exception("generation failed")
            raise HTTPError(500, "generation failed (the server log has the details)") from None
        if not texts:
            raise HTTPError(500, "generation failed: the backend returned no completion")
        return texts

    async def answer(self, req: GenerateRequest) -> Served:
        """One request through the answer path every front end shares (/generate, the OpenAI
        API, the playground): prompt, completions through the model's format's inference loop
        (an agent model's runs its tool loop), then sqlrl.answer's steps, evaluation's and
        TextToSQL's too (SQL, execution when asked, vote), each off the event loop
        (sqlrl.serve.inference)."""
        from sqlrl.serve.inference import answer_request

        return Served(*await answer_request(self, req))

    @property
    def format(self):
        """The model's answer format (sqlrl.formats), as its sqlrl_prompt.json records it."""
        from sqlrl.formats import get_format

        return get_format(self.settings.rollout)

    async def generate(self, req: GenerateRequest) -> dict:
        """The /generate response for a request."""
        return generate_body(req, await self.answer(req))

    async def off_loop(self, fn, *args):
        """`fn(*args)` in the prepare pool: the loop keeps serving, at most PREPARE_WORKERS
        requests use the CPU at once, and a cancelled request's queued work is dropped."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def execute_all(self, db_path, sqls: list[str], max_rows: int):
        """Each SQL run read-only: by this thread's sandboxed executor (sqlrl.sql.executor) on
        a Spider file, or by a live database (sqlrl.live.databases: transpiled, refused or run)."""
        from sqlrl.sql.executor import ExecLimits, default_executor

        if not isinstance(db_path, Path):  # a live database
            return [db_path.run(sql, max_rows) for sql in sqls]
        executor = default_executor(ExecLimits(timeout_s=self.config.exec_timeout_s))
        return [executor.execute(db_path, sql, stop_after=max_rows) for sql in sqls]

    async def run_sql(self, db_id: str, sql: str, max_rows: int | None) -> dict:
        """A query someone wrote or corrected (the playground's Run), on a database of the
        server's Spider directory, through the executor that runs model answers: read-only,
        time- and size-bounded, at most `max_rows` rows (--max-rows at most)."""
        c = self.config
        rows = c.max_rows if max_rows is None else max_rows
        if not 0 <= rows <= c.max_rows:
            raise HTTPError(
                422, f"max_rows must be between 0 and {c.max_rows}, got {rows}", param="max_rows"
            )
        try:
            db_path = self.prompts.check_db_id(db_id, need_file=True)
        except InputError as exc:
            raise HTTPError(exc.status, str(exc), param="db_id") from None
        (verdict,) = await asyncio.to_thread(self.execute_all, db_path, [sql], rows)
        if verdict.status == "refused":  # stopped before it ran: the SQL is at fault
            raise HTTPError(422, f"refused: {verdict.error}", param="sql")
        dialect = {} if isinstance(db_path, Path) else {"dialect": db_path.dialect}
        return {"db_id": db_id, **dialect, **verdict_body(verdict)}

    async def refresh(self, db_id: str) -> dict:
        """A live database introspected again (tables added or changed since the start)."""
        from sqlrl.live.databases import LiveDatabaseError

        database = self.prompts.live.get(db_id)
        if database is None:
            raise HTTPError(
                404, f"{db_id!r} is not a live database (GET /databases lists them)", param="db_id"
            )
        try:
            await asyncio.to_thread(database.refresh)
        except LiveDatabaseError as exc:
            log.error("serve: refresh of %s failed: %s", db_id, exc)
            raise HTTPError(503, f"{db_id} could not be read again (see the server log)") from None
        return self.prompts.schema_of(db_id)

    # ------------------------------------------------------------------ request bodies
    def health(self) -> dict:
        b = self.backend
        return {
            "status": "ok" if b is not None else "loading",
            "model_loaded": b is not None,
            "backend": getattr(b, "name", None),
            "model": Path(self.config.model).name,
            "uptime_s": round(time.time() - self.started, 1),
            "load_seconds": self.load_seconds,
            "prompt": self.settings.record(),
            "spider": {
                "databases": len(self.prompts.schemas),
                "error": self.prompts.spider_error or None,
            },
            "live_databases": {name: db.dialect for name, db in sorted(self.prompts.live.items())},
            "constrained": self.config.constrained,  # the default of a request's `constrained`
            "requests": dict(self.counts),
            **(b.info() if b is not None else {}),
        }

    def model_name(self) -> str:
        """The served model's name: its folder's, never the server's path to it."""
        return Path(self.config.model).name or self.config.model

    def model_card(self) -> dict:
        """The served model as OpenAI's /v1/models lists one."""
        name = self.model_name()
        return {
            "id": name,
            "object": "model",
            "created": int(self.started),
            "owned_by": "sqlrl",
            "root": name,
            "backend": getattr(self.backend, "name", None),
            "max_new_tokens_limit": self.config.max_new_tokens_limit,
        }
