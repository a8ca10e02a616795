"""The FastAPI application: `create_app(ServeConfig(...))`. (This module is `service`, not
`app`, so that `sqlrl.serve.app` is the uvicorn app object.)

Requests are parsed by hand (size cap, read deadline, strict UTF-8, JSON object) and then
validated by a strict pydantic model (`extra="forbid"`, no type coercion), so every input the
server cannot understand gets a 4xx whose `detail` says what is wrong. Generation has a deadline
(504) and a bounded queue (503); anything else that fails is logged and answered with a 500 that
names nothing internal. None of them stops the server.

For a public deployment: request heads are capped (431), an optional API key guards every route
but a minimal /health (401), DDL parsing and tokenization run in a small worker pool off the event
loop, and a request whose client has gone is cancelled, so it never reaches the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import secrets
import sys
import time
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from sqlrl.answer import Answer, candidate_sqls, schema_repair
from sqlrl.data.prompt_settings import PromptSettings, PromptSettingsError
from sqlrl.params import ParamsError, check_sampling
from sqlrl.prompt_builder import InputError, PromptBuilder
from sqlrl.serve.backends import BackendOptions, Busy, NotReady, make_backend
from sqlrl.serve.http_errors import (
    CLOSE,
    HTTPError,
    check_text,
    error_body,
    validation_message,
    validation_param,
)
from sqlrl.serve.trust import LOOPBACK_HOSTS, RequestGuard, split_list

log = logging.getLogger("sqlrl.serve")

# the lowest sampling temperature: below it logits / temperature overflow into NaN
# probabilities (vLLM clamps to the same 0.01); 0 means greedy
MIN_TEMPERATURE = 0.01
PREPARE_WORKERS = 2  # threads parsing DDL, tokenizing and repairing SQL, off the loop
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


@dataclass
class ServeConfig:
    """Everything the server is configured with (CLI flags / SQLRL_* environment variables)."""

    model: str = "models/final"
    spider_dir: str = "data/raw/spider"  # named databases (relative: to the working directory)
    backend: str = "auto"  # auto | transformers | vllm
    vllm_engine: str = "auto"  # auto | async | llm
    # prompt settings: the model folder's sqlrl_prompt.json; each of these overrides one
    schema_format: str | None = None  # prepare.schema_format
    sample_rows: int | None = None  # prepare.sample_rows
    system_prompt: str | None = None  # prepare.system_prompt
    mark_schema_mentions: bool | None = None  # prepare.mark_schema_mentions
    schema_repair: bool | None = None  # eval.schema_repair
    sample_rows_token_budget: int | None = None  # prepare.max_prompt_tokens
    dtype: str | None = None
    torch_threads: int = 0  # CPU threads for torch (0: the usable cores)
    # batching and deadlines
    max_batch_size: int = 16
    batch_wait_ms: float = 10.0
    max_queue: int = 256
    request_timeout_s: float = 120.0
    # input limits
    max_body_bytes: int = 256 * 1024
    max_question_chars: int = 2000
    max_schema_chars: int = 100_000
    max_ddl_chars: int = 32_000  # DDL is parsed (sqlglot): its cost grows with length
    max_header_bytes: int = 16 * 1024  # request line and headers (431 beyond)
    body_timeout_s: float = 10.0  # the whole body must arrive within it (408 beyond)
    api_key: str | None = None  # when set: Authorization: Bearer <key> (401 without)
    # browsers (sqlrl.serve.trust): host names besides the loopback ones ("*": any), and web
    # origins besides the server's own that may POST; both comma-separated
    allowed_hosts: str | None = None
    allowed_origins: str | None = None
    max_prompt_tokens: int = 0  # 0: the model's context minus max_new_tokens
    # generation settings: defaults and bounds
    max_new_tokens: int = 128  # default per request
    max_new_tokens_limit: int = 512
    max_num_samples: int = 16
    max_temperature: float = 2.0
    sample_temperature: float = 0.8  # used when num_samples > 1 and none is given
    seed: int | None = None  # None: a fresh seed per sampled request (reported in its answer)
    # execution
    exec_timeout_s: float = 5.0
    max_rows: int = 100  # rows returned at most (a request may ask fewer)
    # feedback (POST /feedback, the playground): a SQLite file; None: feedback is off
    feedback_db: str | None = None
    warmup: bool = True  # one short generation at startup (first call is slow)

    def backend_options(self) -> BackendOptions:
        return BackendOptions(
            backend=self.backend,
            vllm_engine=self.vllm_engine,
            max_batch_size=self.max_batch_size,
            batch_wait_s=self.batch_wait_ms / 1000.0,
            max_queue=self.max_queue,
            default_max_new_tokens=self.max_new_tokens,
            seed=self.seed or 0,
            dtype=self.dtype,
            torch_threads=self.torch_threads,
        )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def prompt_overrides(self) -> dict:
        """{prompt setting: override or None}, keyed as in sqlrl_prompt.json."""
        return {name: getattr(self, field) for name, field in PROMPT_OVERRIDES.items()}


# prompt setting (sqlrl_prompt.json) -> the ServeConfig field (and flag) that overrides it;
# prepare.max_prompt_tokens has another name here: max_prompt_tokens is the request limit
PROMPT_OVERRIDES = {
    "schema_format": "schema_format",
    "sample_rows": "sample_rows",
    "system_prompt": "system_prompt",
    "mark_schema_mentions": "mark_schema_mentions",
    "schema_repair": "schema_repair",
    "max_prompt_tokens": "sample_rows_token_budget",
}


def prompt_settings_for(config: ServeConfig) -> PromptSettings:
    """The served model's prompt settings (PromptSettings.for_model), with the overrides of
    `config`; a model folder without them is an error that names the flags to give."""
    overrides = config.prompt_overrides()
    try:
        return PromptSettings.for_model(config.model, **overrides)
    except PromptSettingsError as exc:
        flags = ", ".join(
            "--" + PROMPT_OVERRIDES[name].replace("_", "-")
            for name, value in overrides.items()
            if value is None
        )
        raise PromptSettingsError(
            f"{exc}. To serve this model anyway, give the settings it was trained with: {flags}"
        ) from None


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


def json_object(body: bytes, example: str) -> dict:
    """A request body as a JSON object, or a 400/422 saying why it is not one (empty, not
    UTF-8, not JSON, nested past the parser, a number longer than Python converts)."""
    if not body.strip():
        raise HTTPError(400, f"empty request body: send a JSON object such as {example}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(
            400, f"request body is not valid UTF-8 (byte {exc.start}: {exc.reason})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HTTPError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise HTTPError(400, "request body is nested too deeply") from None
    except ValueError:  # an integer longer than Python converts
        raise HTTPError(
            400, f"request body has a number of more than {sys.get_int_max_str_digits()} digits"
        ) from None
    if not isinstance(data, dict):
        raise HTTPError(422, f"request body must be a JSON object, got {type(data).__name__}")
    return data


def check_json_content_type(request: Request) -> None:
    """A 415 unless the body is declared JSON: `text/plain` and form bodies are what a page on
    another site can send without asking first (sqlrl.serve.trust)."""
    declared = request.headers.get("content-type", "")
    media_type = declared.partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise HTTPError(
            415,
            f"the body must be JSON sent as Content-Type: application/json, not {declared[:80]!r}"
            if declared
            else "the body must be JSON sent as "
            "Content-Type: application/json (the request has no Content-Type)",
            CLOSE,
        )


def verdict_body(verdict) -> dict:
    """An execution verdict as JSON: status and error, and for a query that ran its columns,
    rows (JSON-safe) and whether they stop at the row limit."""
    return {
        "verdict": {"status": verdict.status, "error": verdict.error},
        "columns": list(verdict.columns) if verdict.columns is not None else None,
        "rows": _json_rows(verdict.rows) if verdict.rows is not None else None,
        "truncated": bool(verdict.truncated),
    }


@dataclass
class Served:
    """What one request's answer path produced, for the route to shape its response."""

    answer: Answer  # the chosen SQL, every sample's SQL, the vote and the verdict
    texts: list[str]  # every completion, in sample order
    prompt_tokens: int
    generation_s: float
    opts: dict  # the settings it was generated with (settings_for)


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
    out["usage"] = {
        "prompt_tokens": served.prompt_tokens,
        "generation_seconds": round(served.generation_s, 4),
    }
    return out


# --------------------------------------------------------------------------- the app


class Service:
    """What the routes share: config, prompt builder, backend, counters."""

    def __init__(self, config: ServeConfig, backend=None, prompt_settings=None):
        self.config = config
        self.backend = backend
        self.settings = prompt_settings or prompt_settings_for(config)
        self.prompts = PromptBuilder(self.settings, config.spider_dir or None)
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
        return dict(
            max_new_tokens=max_new, n=n, temperature=temperature, seed=seed, max_rows=max_rows
        )

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
                "execute needs a db_id: only databases of the server's "
                "Spider directory can be queried",
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
        try:
            texts = await asyncio.wait_for(
                self.backend.complete(
                    prompt,
                    n=opts["n"],
                    temperature=opts["temperature"],
                    max_new_tokens=opts["max_new_tokens"],
                    seed=opts["seed"],
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

    async def unless_disconnected(self, request: Request, coro):
        """`coro`'s result; when the client goes away first, `coro` is cancelled (a queued
        generation is dropped before the model, vLLM aborts it) and the answer is a 499."""
        task = asyncio.ensure_future(coro)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if not task.done() and await request.is_disconnected():
                    raise HTTPError(499, "the client closed the connection")
            return task.result()
        finally:
            task.cancel()

    def execute_all(self, db_path: Path, sqls: list[str], max_rows: int):
        """Each SQL run read-only by this thread's sandboxed executor (sqlrl.sql.executor)."""
        from sqlrl.sql.executor import ExecLimits, default_executor

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
        return {"db_id": db_id, **verdict_body(verdict)}

    # ------------------------------------------------------------------ request bodies
    async def read_body(self, request: Request) -> bytes:
        """The raw body, refused past --max-body-bytes (413, declared or counted) or when it
        does not arrive within --body-timeout-s (408); both close the connection."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if (
            declared is not None
            and declared.isascii()
            and declared.isdigit()
            and int(declared) > limit
        ):
            raise HTTPError(
                413, f"request body is {declared} bytes, over the server's limit of {limit}", CLOSE
            )
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise HTTPError(
                            413, f"request body is over the server's limit of {limit} bytes", CLOSE
                        )
                    chunks.append(chunk)
        except TimeoutError:
            raise HTTPError(
                408, f"request body not received within {self.config.body_timeout_s:g} s", CLOSE
            ) from None
        except ClientDisconnect:
            raise HTTPError(499, "the client closed the connection") from None
        return b"".join(chunks)

    async def parse_body(self, request, model: type[BaseModel] = None, example: str = ""):
        """The body as a `model` (GenerateRequest by default): a JSON object in UTF-8 that
        the strict model accepts, or a 4xx saying what is wrong with it."""
        model = model or GenerateRequest
        check_json_content_type(request)
        data = json_object(
            await self.read_body(request), example or '{"question": "...", "db_id": "..."}'
        )
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise HTTPError(
                422, validation_message(exc, list(model.model_fields)), param=validation_param(exc)
            ) from None

    # ------------------------------------------------------------------ info
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


class HeaderLimit:
    """A 431 for a request line and headers over `limit` bytes. (Alone, uvicorn's h11 answers
    a head over its read limit with a 400 and closes the socket unread, which the client sees
    as a reset; cli.uvicorn_config reads heads far larger, so this answers them.)"""

    def __init__(self, app, limit: int, counts: Counter):
        self.app, self.limit, self.counts = app, limit, counts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            size = (
                len(scope.get("raw_path", b""))
                + len(scope.get("query_string", b""))
                + sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            )
            if size > self.limit:
                self.counts["431"] += 1
                message = (
                    f"request headers are {size} bytes, over the server's limit of {self.limit}"
                )
                response = JSONResponse(
                    error_body(scope.get("path", ""), 431, message),
                    status_code=431,
                    headers=CLOSE,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    config: ServeConfig | None = None,
    *,
    backend=None,
    prompt_settings: PromptSettings | None = None,
    **overrides,
):
    """The FastAPI app. The model is loaded at startup (lifespan), not here.

    `backend` injects a ready backend (tests: a BatchingBackend around any Generator);
    `overrides` are ServeConfig fields (`create_app(model="models/sft", max_batch_size=4)`).
    """
    from sqlrl.serve import openai_api, playground

    config = _with_overrides(config or ServeConfig(), overrides)
    service = Service(config, backend, prompt_settings)
    # /docs and /redoc with their scripts served from the installed package, not a CDN
    app = FastAPIOffline(
        title="sqlrl text-to-SQL",
        version="1",
        lifespan=_lifespan(service),
        summary="Text-to-SQL with a model fine-tuned on Spider",
    )
    app.state.service = service
    app.add_middleware(
        RequestGuard,
        allowed_hosts=[*LOOPBACK_HOSTS, *split_list(config.allowed_hosts)],
        allowed_origins=split_list(config.allowed_origins),
        counts=service.counts,
    )
    app.add_middleware(HeaderLimit, limit=config.max_header_bytes, counts=service.counts)
    _install_error_handlers(app, service)
    guard = KeyGuard(config.api_key)
    keyed = [Depends(guard.require)]
    _add_generate_route(app, service, keyed)
    _add_info_routes(app, service, guard, keyed)
    openai_api.add_routes(app, service, keyed)
    playground.add_routes(app, service, keyed)
    return app


def _with_overrides(config: ServeConfig, overrides: dict) -> ServeConfig:
    """`config` with some fields replaced; an unknown name is a TypeError, not ignored."""
    if not overrides:
        return config
    unknown = set(overrides) - set(ServeConfig.field_names())
    if unknown:
        raise TypeError(f"unknown ServeConfig field(s): {', '.join(sorted(unknown))}")
    return ServeConfig(**{**asdict(config), **overrides})


def _lifespan(service: Service):
    """Load the model when the server starts, release it when it stops."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await service.start()
        try:
            yield
        finally:
            await service.close()

    return lifespan


def _install_error_handlers(app: FastAPI, service: Service) -> None:
    """Every refusal counted and answered in the shape its route's clients read (OpenAI's
    under /v1/, `detail` elsewhere), Starlette's own 404 and 405 included."""

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        service.counts[str(exc.status)] += 1
        body = error_body(request.url.path, exc.status, exc.message, exc.param)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, exc: StarletteHTTPException):
        service.counts[str(exc.status_code)] += 1
        body = error_body(request.url.path, exc.status_code, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


class KeyGuard:
    """--api-key: every route but /health (and the static page and docs) needs
    `Authorization: Bearer <key>`; compared in constant time."""

    def __init__(self, api_key: str | None):
        self.api_key = api_key

    def authorized(self, request: Request) -> bool:
        if not self.api_key:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            token.strip().encode("latin-1"), self.api_key.encode("utf-8")
        )

    async def require(self, request: Request) -> None:
        if not self.authorized(request):
            raise HTTPError(
                401,
                "missing or wrong API key: send Authorization: Bearer <key>",
                {"www-authenticate": "Bearer"},
            )


async def guarded(service: Service, route: str, work):
    """`await work()` for a route: an HTTPError passes through as it is; anything else is a
    bug or a broken dependency, logged in full and answered with a 500 naming nothing."""
    try:
        result = await work()
    except HTTPError:
        raise
    except Exception:  # noqa: BLE001 - a bug or a broken dependency: logged, not shown
        log.exception("%s failed", route)
        raise HTTPError(500, "internal server error (the server log has the details)") from None
    service.counts["200"] += 1
    return result


def json_body_schema(model: type[BaseModel]) -> dict:
    """OpenAPI's request body for a route that parses its body by hand (/docs shows it)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


def _add_generate_route(app: FastAPI, service: Service, keyed: list) -> None:
    @app.post("/generate", dependencies=keyed, openapi_extra=json_body_schema(GenerateRequest))
    async def generate(request: Request):
        """SQL for a question about a schema (schema_str, db_id or ddl); see the README."""

        async def work():
            req = await service.parse_body(request)
            return await service.unless_disconnected(request, service.generate(req))

        return await guarded(service, "POST /generate", work)


def _add_info_routes(app: FastAPI, service: Service, guard: KeyGuard, keyed: list) -> None:
    @app.get("/health")
    async def health(request: Request):
        """Open to load balancers; without the API key (when one is set) only the status."""
        info = service.health()
        return info if guard.authorized(request) else {"status": info["status"]}

    @app.get("/v1/models", dependencies=keyed)
    async def models():
        return {"object": "list", "data": [service.model_card()]}

    @app.get("/databases", dependencies=keyed)
    async def databases():
        """The Spider databases by name (never the server's paths)."""
        return {"databases": service.prompts.databases()}

    @app.get("/databases/{db_id}", dependencies=keyed)
    async def database(db_id: str):
        """One database's schema: tables, columns (type, primary key) and foreign keys."""
        check_text("db_id", db_id, 128)
        try:
            return service.prompts.schema_of(db_id)
        except InputError as exc:
            raise HTTPError(exc.status, str(exc), param="db_id") from None
