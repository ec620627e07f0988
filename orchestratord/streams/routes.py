"""SSE: ``GET /v1/steps/{id}/stream`` and ``GET /v1/runs/{id}/stream``."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent

from orchestrator_core.errors import InvalidParams
from orchestratord.api.deps import orchestrator
from orchestratord.runs.service import get_run
from orchestratord.runtime import Orchestrator
from orchestratord.steps.queries import cancel_on_disconnect
from orchestratord.streams.sse import follow_run, follow_step

router = APIRouter(tags=["streams"])

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keep-alive")


def _resume_from(last_event_id: str | None, after: int | None) -> int:
    """The first cursor to send: one past ``Last-Event-ID`` (or the ``after`` query)."""
    if last_event_id is not None and last_event_id.strip() != "":
        try:
            value = int(last_event_id.strip())
        except ValueError:
            raise InvalidParams(
                "must be an integer event id", field="header.Last-Event-ID"
            ) from None
        if value < -1:
            raise InvalidParams("must be >= -1", field="header.Last-Event-ID")
        return value + 1
    if after is not None:
        return after + 1
    return 0


def _response(orch: Orchestrator, body: AsyncIterator[bytes]) -> EventSourceResponse:
    return EventSourceResponse(
        body,
        headers=SSE_HEADERS,
        ping=orch.settings.stream.keepalive_s,
        ping_message_factory=_keepalive,
    )


@router.get("/v1/steps/{step_id}/stream", response_class=EventSourceResponse)
async def stream_step(
    step_id: str,
    last_event_id: str | None = Header(default=None),
    after: int | None = Query(default=None, ge=-1, description="resume after this seq"),
    orch: Orchestrator = Depends(orchestrator),
) -> EventSourceResponse:
    start = _resume_from(last_event_id, after)
    async with orch.db.read() as session:
        cod = await cancel_on_disconnect(session, step_id=step_id)
    return _response(orch, follow_step(orch, step_id, start, cancel_on_disconnect=cod))


@router.get("/v1/runs/{run_id}/stream", response_class=EventSourceResponse)
async def stream_run(
    run_id: str,
    last_event_id: str | None = Header(default=None),
    after: int | None = Query(default=None, ge=-1, description="resume after this run cursor"),
    orch: Orchestrator = Depends(orchestrator),
) -> EventSourceResponse:
    start = _resume_from(last_event_id, after)
    async with orch.db.read() as session:
        await get_run(session, run_id=run_id)
    return _response(orch, follow_run(orch, run_id, start))
