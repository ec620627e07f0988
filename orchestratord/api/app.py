"""The FastAPI application."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI
from starlette.types import Receive, Scope, Send

from orchestratord import __version__
from orchestratord.api import errors, hot_routes, metrics_routes, openapi_doc
from orchestratord.api.auth import AuthMiddleware
from orchestratord.api.body_limit import BodyLimitMiddleware
from orchestratord.api.correlation import CorrelationIdMiddleware
from orchestratord.api.header_limit import HeaderLimitMiddleware
from orchestratord.api.json_keys import refuse_duplicate_keys
from orchestratord.api.params import refuse_nul
from orchestratord.api.request_spans import RequestSpanMiddleware
from orchestratord.api.responses import JsonResponse
from orchestratord.facts import routes as facts
from orchestratord.flows import routes as flows
from orchestratord.pools import capability_routes as caps
from orchestratord.pools import routes as pools
from orchestratord.runs import routes as runs
from orchestratord.runs import transfer_routes as transfer
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from orchestratord.steps import routes as steps
from orchestratord.streams import routes as streams
from orchestratord.streams.response import RAW_SEND
from orchestratord.ui import install as install_ui

if TYPE_CHECKING:
    from orchestratord.evergreen.server import EvergreenServer


class App(FastAPI):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the server's own ``send``: a stream's frames after its response start go to it
        # directly, past the middlewares that look only at the start (``streams/response.py``)
        scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


def freeze_startup_heap() -> None:
    """Keep what startup built (modules, models, compiled statements: most of the heap) out of
    the collector's full passes: measured, a full collection of a serving process took 80 ms,
    all of it added to whichever request was being served (idle TTFT p99 +80 ms on
    PostgreSQL, one probe in a hundred); what is frozen is never freed, and startup's garbage
    is collected first."""
    gc.collect()
    gc.freeze()


async def _evergreen(orch: Orchestrator) -> EvergreenServer | None:
    """The Evergreen front door, when its port is set (``--evergreen-port``)."""
    port = orch.settings.evergreen.port
    if port is None:
        return None
    from orchestratord.evergreen.server import EvergreenServer

    front = EvergreenServer(orch, host=orch.settings.host, port=port)
    await front.start()
    return front


def create_app(
    settings: Settings | None = None, *, orchestrator: Orchestrator | None = None
) -> FastAPI:
    """Build the app. With ``orchestrator`` given, the caller starts and stops it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if orchestrator is not None:
            app.state.orchestrator = orchestrator
            yield
            return
        orch = Orchestrator(settings or Settings())
        await orch.start()
        orch.reload_on_sighup()
        app.state.orchestrator = orch
        front = await _evergreen(orch)
        freeze_startup_heap()
        try:
            yield
        finally:
            if front is not None:
                await front.stop()
            await orch.stop()

    app = App(
        title="orchestratord",
        version=__version__,
        summary="Control plane for LLM agent work: flows, runs, steps, facts, pools; typed SSE.",
        lifespan=lifespan,
        # /docs is served by orchestratord.ui with local assets, not a CDN's; no /redoc
        docs_url=None,
        redoc_url=None,
        default_response_class=JsonResponse,
        dependencies=[Depends(refuse_nul), Depends(refuse_duplicate_keys)],
    )
    if orchestrator is not None:
        app.state.orchestrator = orchestrator
    errors.install(app)
    openapi_doc.install(app)
    for module in (flows, runs, steps, facts, pools, caps, streams, transfer, metrics_routes):
        app.include_router(module.router)
    hot_routes.install(app)
    install_ui(app)  # the dashboard at /ui, and /docs

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    limits = (settings or (orchestrator.settings if orchestrator else Settings())).limits
    # the last added runs first: a key is checked before any body is read
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes)
    app.add_middleware(AuthMiddleware)
    app.add_middleware(
        HeaderLimitMiddleware,
        max_headers=limits.max_headers,
        max_bytes=limits.max_header_bytes,
    )
    app.add_middleware(CorrelationIdMiddleware)
    app.add_middleware(RequestSpanMiddleware)  # outside: sees the final status and id
    return app
