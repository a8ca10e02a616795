"""Errors the server answers with, in the two shapes its clients read.

Every refusal is an `HTTPError` (status, a message saying what is wrong, optionally the request
field at fault). Routes under /v1/ speak the OpenAI API, whose clients (the `openai` package,
LangChain, WrenAI) parse `{"error": {"message", "type", "param", "code"}}`; every other route
answers `{"detail": message}` as FastAPI does. One function picks the shape from the path, so a
refusal raised anywhere (the API key check, body parsing, generation) reads right to its client.
"""

from __future__ import annotations

from pydantic import ValidationError

CLOSE = {"connection": "close"}  # the rest of a refused request is not read: do not reuse

# the OpenAI error `type` and `code` for each status the server answers with
_OPENAI_KINDS = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "timeout"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_value"),
    431: ("invalid_request_error", "request_too_large"),
    499: ("invalid_request_error", "client_closed_request"),
    503: ("server_error", "overloaded"),
    504: ("server_error", "timeout"),
}


class HTTPError(Exception):
    """A request the server refuses or cannot finish: `status`, a message for the client, the
    field at fault (`param`, where one is) and response headers."""

    def __init__(
        self, status: int, message: str, headers: dict | None = None, param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.param = param


def is_openai_path(path: str) -> bool:
    """Routes whose clients expect OpenAI's error shape."""
    return path.startswith("/v1/")


def openai_error(status: int, message: str, param: str | None = None) -> dict:
    """OpenAI's error body: what its clients raise as `openai.BadRequestError` and friends."""
    kind, code = _OPENAI_KINDS.get(
        status, ("invalid_request_error" if status < 500 else "server_error", None)
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_body(path: str, status: int, message: str, param: str | None = None) -> dict:
    """The error body for a request to `path`: OpenAI's shape under /v1/, else `detail`."""
    if is_openai_path(path):
        return openai_error(status, message, param)
    return {"detail": message}


def validation_message(exc: ValidationError, allowed: list[str]) -> str:
    """A pydantic error as one line naming each field at fault; an unknown field lists the
    fields the request may have."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "body"
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = f"unknown field (allowed: {', '.join(allowed)})"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def validation_param(exc: ValidationError) -> str | None:
    """The first field a pydantic error names (OpenAI's `param`)."""
    for err in exc.errors():
        loc = err.get("loc", ())
        if loc:
            return str(loc[0])
    return None


def check_text(name: str, value: str, limit: int) -> None:
    """A 413 for text over `limit` characters, a 400 for text that is not valid Unicode (a
    lone surrogate from a JSON escape): neither may reach the tokenizer or the database."""
    if len(value) > limit:
        raise HTTPError(
            413,
            f"{name} is {len(value)} characters, over the server's limit of {limit}",
            param=name,
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise HTTPError(
            400,
            f"{name} is not valid Unicode text ({exc.reason} at position {exc.start})",
            param=name,
        ) from None
