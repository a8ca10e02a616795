"""The FastAPI application: `create_app(ServeConfig(...))` assembles the service, the HTTP
plumbing, the browser guards and the routes (sqlrl/serve/routes/). (Not `app.py`: that name
is the uvicorn app object, `sqlrl.serve.app`.)"""

from __future__ import annotations

import contextlib

from fastapi import Depends
from fastapi_offline import FastAPIOffline

from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.serve.config import ServeConfig, with_overrides
from sqlrl.serve.http import HeaderLimit, KeyGuard, install_error_handlers
from sqlrl.serve.routes import native, openai, playground
from sqlrl.serve.service import Service
from sqlrl.serve.trust import LOOPBACK_HOSTS, RequestGuard, split_list


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
    config = with_overrides(config or ServeConfig(), overrides)
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
    install_error_handlers(app, service.counts)
    guard = KeyGuard(config.api_key)
    keyed = [Depends(guard.require)]
    native.add_routes(app, service, guard, keyed)
    openai.add_routes(app, service, keyed)
    playground.add_routes(app, service, keyed)
    return app


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
