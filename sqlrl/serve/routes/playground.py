"""The playground page and the two routes it needs besides /generate and /databases.

- `GET /`: a plain HTML page (sqlrl/serve/static/, no build step; its content security policy
  lets it load nothing but this server's own files): pick a database (its schema is shown) or
  paste DDL, ask, see the SQL (and an agent trace where the answer has one), run it, see the
  rows, mark the answer right or wrong and correct it. The page and its script are open; each
  page carries a fresh session token (sqlrl.serve.trust) that its feedback sends, and every
  call sends the API key typed into the page.
- `POST /execute` {"db_id", "sql", "max_rows"?}: a query someone wrote or corrected, run by
  the sandboxed read-only executor that runs model answers, rows capped by --max-rows.
- `POST /feedback` {"question", "predicted_sql", "verdict": "right" | "wrong",
  "corrected_sql"?, and "db_id" or "ddl"}: one judgement, stored in --feedback-db
  (sqlrl.feedback) with its writer before the answer says so. The SQL it vouches for (the
  answer marked right, or the correction) is run read-only first, and a judgement whose SQL
  fails is refused with the error (422), so a slip never stands in for a verified pair.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from functools import cache
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict

from sqlrl.feedback import FeedbackStore, Judgement, verified_sql
from sqlrl.request_input import InputError
from sqlrl.serve.http import guarded, json_body_schema, parse_body
from sqlrl.serve.http_errors import HTTPError, check_text
from sqlrl.serve.service import Service
from sqlrl.serve.trust import PageTokens, feedback_writer

log = logging.getLogger("sqlrl.serve")
STATIC = Path(__file__).parent.parent / "static"
MAX_SQL_CHARS = 10_000  # the executor's own limit (ExecLimits.max_sql_chars)
# the page loads only this server's files and talks only to this server
PAGE_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


class RunRequest(BaseModel):
    """POST /execute."""

    model_config = ConfigDict(extra="forbid", strict=True)

    db_id: str
    sql: str
    max_rows: int | None = None


class FeedbackRequest(BaseModel):
    """POST /feedback. Exactly one of db_id, ddl; corrected_sql only with verdict wrong."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: str
    predicted_sql: str
    verdict: Literal["right", "wrong"]
    corrected_sql: str | None = None
    db_id: str | None = None
    ddl: str | None = None


@cache
def static_file(name: str) -> bytes:
    """A file of the page, read once."""
    return (STATIC / name).read_bytes()


def check_sql(name: str, sql: str) -> str:
    """SQL within the executor's length limit, valid Unicode, not blank; stripped."""
    check_text(name, sql, MAX_SQL_CHARS)
    if not sql.strip():
        raise HTTPError(422, f"{name} is empty", param=name)
    return sql.strip()


def page_html(tokens: PageTokens) -> bytes:
    """The playground page with a fresh session token for its feedback."""
    return static_file("playground.html").replace(b"{{page_token}}", tokens.issue().encode())


def judgement_from(service: Service, req: FeedbackRequest, writer: str) -> Judgement:
    """A FeedbackRequest checked like every request (limits, Unicode, a known database) and
    made a Judgement of the served model."""
    c = service.config
    if (req.db_id is None) == (req.ddl is None):
        raise HTTPError(422, "give exactly one of db_id or ddl (what the question was about)")
    check_text("question", req.question, c.max_question_chars)
    if not req.question.strip():
        raise HTTPError(422, "question is empty", param="question")
    predicted = check_sql("predicted_sql", req.predicted_sql)
    corrected = None
    if req.corrected_sql is not None:
        if req.verdict != "wrong":
            raise HTTPError(
                422, "corrected_sql goes with verdict 'wrong' only", param="corrected_sql"
            )
        corrected = check_sql("corrected_sql", req.corrected_sql)
    if req.db_id is not None:
        check_text("db_id", req.db_id, 128)
        try:
            service.prompts.check_db_id(req.db_id, need_file=False)
        except InputError as exc:
            raise HTTPError(exc.status, str(exc), param="db_id") from None
    if req.ddl is not None:
        check_text("ddl", req.ddl, c.max_ddl_chars)
    live = service.prompts.live.get(req.db_id) if req.db_id is not None else None
    return Judgement(
        question=req.question.strip(),
        predicted_sql=predicted,
        verdict=req.verdict,
        model=service.model_name(),
        db_id=req.db_id,
        ddl=req.ddl,
        corrected_sql=corrected,
        writer=writer,
        dialect=live.dialect if live is not None else None,
    )


async def check_it_runs(service: Service, judgement: Judgement) -> None:
    """A 422 with the database's error when the SQL a judgement vouches for does not run on
    its database (read-only, as the export will check it). DDL has no database: its
    judgements are stored unchecked, and the export skips them."""
    sql = verified_sql(judgement)
    if sql is None or judgement.db_id is None:
        return
    result = await service.run_sql(judgement.db_id, sql, 0)
    verdict = result["verdict"]
    if verdict["status"] != "ok":
        name = "corrected_sql" if judgement.corrected_sql else "predicted_sql"
        what = "the correction" if judgement.corrected_sql else "an answer marked right"
        raise HTTPError(
            422,
            f"{what} does not run on {judgement.db_id}, so it was not stored: "
            f"{verdict['status']}: {verdict['error']}",
            param=name,
        )


async def store_feedback(
    service: Service, store: FeedbackStore | None, tokens: PageTokens, request: Request
):
    """Parse, check (writer, limits, the SQL runs) and store one judgement; the answer comes
    after its commit."""
    if store is None:
        raise HTTPError(
            503, "feedback is off: the server was started without --feedback-db (SQLRL_FEEDBACK_DB)"
        )
    req = await parse_body(
        request,
        service.config,
        FeedbackRequest,
        '{"db_id": "...", "question": "...", "predicted_sql": "...", "verdict": "right"}',
    )
    writer = feedback_writer(request, service.config.api_key, tokens)
    judgement = judgement_from(service, req, writer)
    await check_it_runs(service, judgement)
    try:
        stored = await asyncio.to_thread(store.add, judgement)
    except sqlite3.OperationalError as exc:  # locked past the busy timeout, disk full
        log.error("serve: feedback not stored: %s", exc)
        raise HTTPError(503, "feedback could not be stored now; try again") from None
    return {
        "id": stored.id,
        "created_at": stored.created_at,
        "writer": stored.writer,
        "model": stored.model,
        **({"db_id": stored.db_id, "dialect": stored.dialect} if stored.dialect else {}),
        "stored": True,
    }


async def run_query(service: Service, request: Request):
    req = await parse_body(
        request, service.config, RunRequest, '{"db_id": "concert_singer", "sql": "SELECT ..."}'
    )
    check_text("db_id", req.db_id, 128)
    return await service.run_sql(req.db_id, check_sql("sql", req.sql), req.max_rows)


def add_routes(app: FastAPI, service: Service, keyed: list) -> None:
    store = FeedbackStore(service.config.feedback_db) if service.config.feedback_db else None
    tokens = PageTokens()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        """The playground (open: it holds no data; its calls send the key)."""
        return HTMLResponse(page_html(tokens), headers=PAGE_HEADERS)

    @app.get("/playground.js", include_in_schema=False)
    async def script():
        return Response(
            static_file("playground.js"), media_type="text/javascript", headers=PAGE_HEADERS
        )

    @app.get("/playground.css", include_in_schema=False)
    async def style():
        return Response(static_file("playground.css"), media_type="text/css", headers=PAGE_HEADERS)

    @app.post("/execute", dependencies=keyed, openapi_extra=json_body_schema(RunRequest))
    async def execute(request: Request):
        """Run SQL read-only on a server database (rows capped by --max-rows)."""
        return await guarded(service, "POST /execute", lambda: run_query(service, request))

    @app.post("/feedback", dependencies=keyed, openapi_extra=json_body_schema(FeedbackRequest))
    async def feedback(request: Request):
        """Store a judgement of an answer (right, or wrong with the right SQL)."""
        return await guarded(
            service, "POST /feedback", lambda: store_feedback(service, store, tokens, request)
        )
