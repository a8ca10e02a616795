"""HTTP plumbing every route shares: request bodies read within limits and parsed strictly,
the API key, head size limits, error handlers in each route's shape, the 500 guard, and the
wait that drops a request whose client has gone. None of it knows what the routes do."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sys
from collections import Counter

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from sqlrl.serve.http_errors import (
    CLOSE,
    HTTPError,
    error_body,
    validation_message,
    validation_param,
)

log = logging.getLogger("sqlrl.serve")


DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


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


async def read_body(request: Request, config) -> bytes:
    """The raw body, refused past --max-body-bytes (413, declared or counted) or when it
    does not arrive within --body-timeout-s (408); both close the connection."""
    limit = config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise HTTPError(
            413, f"request body is {declared} bytes, over the server's limit of {limit}", CLOSE
        )
    chunks, size = [], 0
    try:
        async with asyncio.timeout(config.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HTTPError(
                        413, f"request body is over the server's limit of {limit} bytes", CLOSE
                    )
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPError(
            408, f"request body not received within {config.body_timeout_s:g} s", CLOSE
        ) from None
    except ClientDisconnect:
        raise HTTPError(499, "the client closed the connection") from None
    return b"".join(chunks)


async def parse_body(request: Request, config, model: type[BaseModel], example: str):
    """The body as a `model` (GenerateRequest by default): a JSON object in UTF-8 that
    the strict model accepts, or a 4xx saying what is wrong with it."""
    check_json_content_type(request)
    data = json_object(await read_body(request, config), example)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise HTTPError(
            422, validation_message(exc, list(model.model_fields)), param=validation_param(exc)
        ) from None


# ------------------------------------------------------------------ info


async def unless_disconnected(request: Request, coro):
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


def install_error_handlers(app: FastAPI, counts: Counter) -> None:
    """Every refusal counted and answered in the shape its route's clients read (OpenAI's
    under /v1/, `detail` elsewhere), Starlette's own 404 and 405 included."""

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        counts[str(exc.status)] += 1
        body = error_body(request.url.path, exc.status, exc.message, exc.param)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, exc: StarletteHTTPException):
        counts[str(exc.status_code)] += 1
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


async def guarded(service, route: str, work):
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
