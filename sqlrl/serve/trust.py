"""Who may talk to the server from a browser, and who wrote a piece of feedback.

Feedback is training data (`python -m sqlrl.feedback export` turns it into train pairs), so
its write path gets the care of a write into the dataset. A web page on another site must not
be able to write through a user's browser, and each record says who wrote it:

- **Host** (`RequestGuard`): a request must name a host this server answers to: loopback
  names by default, `--allowed-hosts` for more. Without it a page on another site could make
  its own name resolve to 127.0.0.1 (DNS rebinding) and then be "same origin" with us.
- **Origin** (`RequestGuard`): a browser sends `Origin` with every cross-site POST (forms and
  `fetch(..., {mode: "no-cors"})` included); a POST whose Origin is not this server's own (or
  in `--allowed-origins`) is refused with a 403 before it reaches a route. Clients that are not
  browsers (curl, the OpenAI client) send no Origin and are unaffected.
- **JSON only**: every POST body must be `Content-Type: application/json` (a 415 otherwise,
  `sqlrl.serve.http.parse_body`), the type a page on another site cannot send without asking first.
- **The page's session token** (`PageTokens`): the playground page is served with a token
  signed by a secret the server draws at start; its feedback carries the token. Without an
  API key, feedback is accepted only with a valid token, and the record's writer is "local
  page"; with an API key, the key is the credential and the writer is the key's id (a short
  hash of it, never the key). A restarted server draws a new secret: the page says to reload.

The checks are written here rather than taken from Starlette's TrustedHostMiddleware so that
a refusal has the same JSON shape, counter and wording (naming the flag to change) as every
other refusal of this server.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse

from sqlrl.serve.http_errors import HTTPError, error_body

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
PAGE_TOKEN_HEADER = "x-sqlrl-page-token"
LOCAL_PAGE = "local page"


def split_list(value: str | None) -> list[str]:
    """A comma-separated flag value as a list (blank items dropped)."""
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port ('[::1]:8000' -> '::1'), lowercased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_allowed(name: str, allowed: list[str]) -> bool:
    """`name` is one of `allowed`: '*' allows any, '*.example.com' any subdomain."""
    for pattern in allowed:
        if pattern == "*" or name == pattern:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
    return False


def key_id(api_key: str) -> str:
    """The name a record gives the API key that wrote it: a short hash, never the key."""
    return "key:" + hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:12]


class RequestGuard:
    """ASGI middleware: the Host and Origin checks of the module docstring."""

    def __init__(self, app, allowed_hosts: list[str], allowed_origins: list[str], counts):
        self.app = app
        self.allowed_hosts = [h.lower().strip("[]") for h in allowed_hosts]
        self.allowed_origins = [o.lower().rstrip("/") for o in allowed_origins]
        self.counts = counts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                status, message = refusal
                self.counts[str(status)] += 1
                response = JSONResponse(error_body(scope["path"], status, message), status)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope) -> tuple[int, str] | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if not host_allowed(host_name(host), self.allowed_hosts):
            return 400, (
                f"this server does not answer to the host {host[:100]!r} (start it with "
                f"--allowed-hosts to add a name)"
            )
        origin = headers.get("origin")
        if origin is None or scope["method"] in SAFE_METHODS:
            return None
        if self.origin_allowed(origin, host):
            return None
        return 403, (
            f"a request from the web page at {origin[:100]!r} may not write to this server "
            f"(start it with --allowed-origins to allow a site)"
        )

    def origin_allowed(self, origin: str, host: str) -> bool:
        """The server's own origin (the page it served), or one of --allowed-origins."""
        origin = origin.strip().lower().rstrip("/")
        if origin in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc == host.strip().lower()


class PageTokens:
    """Tokens for the playground page: `issue()` one per page served, `valid()` checks one.

    A token is a random nonce and its HMAC under the server's secret, drawn at start; nothing
    is stored, and a token from before a restart is no longer valid."""

    def __init__(self, secret: bytes | None = None):
        self.secret = secret or secrets.token_bytes(32)

    def _sign(self, nonce: str) -> str:
        return hmac.new(self.secret, nonce.encode("ascii"), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        nonce = secrets.token_hex(16)
        return f"{nonce}.{self._sign(nonce)}"

    def valid(self, token: str | None) -> bool:
        if not token or not token.isascii():
            return False
        nonce, _, signature = token.partition(".")
        return hmac.compare_digest(signature.encode("ascii"), self._sign(nonce).encode("ascii"))


def feedback_writer(request: Request, api_key: str | None, tokens: PageTokens) -> str:
    """Who is writing this feedback: the API key's id (the key was checked by KeyGuard), or,
    without an API key, the playground page (its token must be valid); a 403 otherwise."""
    if api_key:
        return key_id(api_key)
    if tokens.valid(request.headers.get(PAGE_TOKEN_HEADER)):
        return LOCAL_PAGE
    raise HTTPError(
        403,
        "feedback is training data: without an API key the server takes it only from its own "
        "playground page (its session token is missing or from before the server restarted: "
        "reload the page), or start the server with an API key (SQLRL_API_KEY) and send it",
    )
