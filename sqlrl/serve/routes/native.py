"""The native routes: POST /generate, and what a client reads about the server (/health,
/v1/models, /databases, /databases/{db_id})."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request

from sqlrl.request_input import InputError
from sqlrl.serve.http import KeyGuard, guarded, json_body_schema, parse_body, unless_disconnected
from sqlrl.serve.http_errors import (
    HTTPError,
    check_text,
)
from sqlrl.serve.service import GenerateRequest, Service

log = logging.getLogger("sqlrl.serve")
GENERATE_EXAMPLE = '{"question": "...", "db_id": "..."}'


def add_routes(app: FastAPI, service: Service, guard: KeyGuard, keyed: list) -> None:
    _add_generate_route(app, service, keyed)
    _add_info_routes(app, service, guard, keyed)


def _add_generate_route(app: FastAPI, service: Service, keyed: list) -> None:
    @app.post("/generate", dependencies=keyed, openapi_extra=json_body_schema(GenerateRequest))
    async def generate(request: Request):
        """SQL for a question about a schema (schema_str, db_id or ddl); see the README."""

        async def work():
            req = await parse_body(request, service.config, GenerateRequest, GENERATE_EXAMPLE)
            return await unless_disconnected(request, service.generate(req))

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
        """The databases by name: Spider's, and the live ones with their dialect (never the
        server's paths or URLs)."""
        return {"databases": service.prompts.databases()}

    @app.post("/databases/{db_id}/refresh", dependencies=keyed)
    async def refresh(db_id: str):
        """A live database's schema read again (tables added or changed since the start)."""
        check_text("db_id", db_id, 128)
        return await service.refresh(db_id)

    @app.get("/databases/{db_id}", dependencies=keyed)
    async def database(db_id: str):
        """One database's schema: tables, columns (type, primary key) and foreign keys."""
        check_text("db_id", db_id, 128)
        try:
            return service.prompts.schema_of(db_id)
        except InputError as exc:
            raise HTTPError(exc.status, str(exc), param="db_id") from None
