"""SSE: ``GET /v1/steps/{id}/stream`` and ``GET /v1/runs/{id}/stream``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping

from fastapi import APIRouter, Header, Query, Request

from contracts.bounds import MAX_INT
from orchestrator_core.errors import InvalidParams, LimitExceeded
from orchestrator_core.keys import Principal
from orchestratord.api.auth import READ
from orchestratord.runs.service import get_run
from orchestratord.runtime import Orchestrator
from orchestratord.steps.queries import cancel_on_disconnect
from orchestratord.streams.response import EventStreamResponse
from orchestratord.streams.sse import follow_run, follow_step

router = APIRouter(tags=["streams"])

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
_EVENT_ID = re.compile(r"-?[0-9]+")  # the ids the streams write: ASCII decimal integers


def resume_from(
    last_event_id: str | None, after: int | None, *, raw_after: str | None = None
) -> int:
    """The first cursor to send: one past ``Last-Event-ID`` (or the ``after`` query). Both
    take the ids the streams write, ASCII decimal integers, and nothing else ("+1", "1_0")."""
    if raw_after is not None and _EVENT_ID.fullmatch(raw_after) is None:
        raise InvalidParams("must be an integer event id", field="query.after")
    if last_event_id is not None and last_event_id.strip() != "":
        text = last_event_id.strip()
        try:
            if _EVENT_ID.fullmatch(text) is None:  # int() also takes "+1", "1_0", other digits
                raise ValueError(text)
            value = int(text)
        except ValueError:
            raise InvalidParams(
                "must be an integer event id", field="header.Last-Event-ID"
            ) from None
        if not -1 <= value <= MAX_INT:
            raise InvalidParams(f"must be within -1..{MAX_INT}", field="header.Last-Event-ID")
        return value + 1
    if after is not None:
        return after + 1
    return 0


def _admit(orch: Orchestrator, step_id: str | None) -> None:
    """Refuse a stream past the process's limits (before the follower subscribes)."""
    limits, hub = orch.settings.stream, orch.hub
    if step_id is not None and hub.followers(step_id) >= limits.max_followers_per_step:
        raise LimitExceeded(
            f"step {step_id} has {limits.max_followers_per_step} open streams here",
            limit="stream.max_followers_per_step",
            value=limits.max_followers_per_step,
            retry_after_ms=1000,
        )
    if hub.open_streams() >= limits.max_followers:
        raise LimitExceeded(
            f"this process holds {limits.max_followers} open streams",
            limit="stream.max_followers",
            value=limits.max_followers,
            retry_after_ms=1000,
        )


def admit(orch: Orchestrator, principal: Principal | None) -> None:
    """A submission that answers with its step's stream: refuse the stream past the
    process's and the key's limits before the step is made, else count it as open
    (``let_go`` if it is then not sent)."""
    _admit(orch, None)
    if principal is not None:
        orch.key_streams.open(principal.key_id)


def let_go(orch: Orchestrator, principal: Principal | None) -> None:
    if principal is not None:
        orch.key_streams.close(principal.key_id)


def _response(
    orch: Orchestrator,
    principal: Principal | None,
    body: AsyncIterator[bytes],
    *,
    counted: bool = False,
    status_code: int = 200,
    own_headers: Mapping[str, str] | None = None,
) -> EventStreamResponse:
    """The stream, counted as one of the key's (``counted``: by ``admit`` already)."""
    if principal is not None:
        if not counted:
            orch.key_streams.open(principal.key_id)
        body = orch.key_streams.held(principal.key_id, body)
    return EventStreamResponse(
        body, headers=SSE_HEADERS, status_code=status_code, own_headers=own_headers
    )


def submitted_step_stream(
    orch: Orchestrator,
    principal: Principal | None,
    *,
    step_id: str,
    cancel_on_disconnect: bool,
    status_code: int,
    own_headers: Mapping[str, str],
) -> EventStreamResponse:
    """A step's stream from its first event, as the answer to its submission (admitted by
    ``admit`` before the step was made)."""
    body = follow_step(orch, step_id, 0, cancel_on_disconnect=cancel_on_disconnect)
    return _response(
        orch, principal, body, counted=True, status_code=status_code, own_headers=own_headers
    )


@router.get("/v1/steps/{step_id}/stream", response_class=EventStreamResponse)
async def stream_step(
    request: Request,
    step_id: str,
    last_event_id: str | None = Header(default=None),
    after: int | None = Query(
        default=None, ge=-1, le=MAX_INT, description="resume after this seq (-1..2^53-1)"
    ),
    principal: Principal | None = READ,
) -> EventStreamResponse:
    # answered by api/hot_routes.py before FastAPI's routing when it has no query string
    raw_after = request.query_params.get("after")
    return await answer_step_stream(
        request.app.state.orchestrator,
        step_id,
        resume_from(last_event_id, after, raw_after=raw_after),
        principal,
    )


async def answer_step_stream(
    orch: Orchestrator, step_id: str, start: int, principal: Principal | None
) -> EventStreamResponse:
    _admit(orch, step_id)
    known = orch.hub.known_step(step_id)  # run here: the step exists, nothing to read
    if known is not None and known.cancel_on_disconnect is not None:
        cod = known.cancel_on_disconnect
    else:  # a read in a turn, as the run stream's
        async with orch.hub.turns, orch.db.read() as session:
            cod = await cancel_on_disconnect(session, step_id=step_id)
    return _response(orch, principal, follow_step(orch, step_id, start, cancel_on_disconnect=cod))


@router.get("/v1/runs/{run_id}/stream", response_class=EventStreamResponse)
async def stream_run(
    request: Request,
    run_id: str,
    last_event_id: str | None = Header(default=None),
    after: int | None = Query(
        default=None, ge=-1, le=MAX_INT, description="resume after this run cursor (-1..2^53-1)"
    ),
    principal: Principal | None = READ,
) -> EventStreamResponse:
    orch: Orchestrator = request.app.state.orchestrator
    start = resume_from(last_event_id, after, raw_after=request.query_params.get("after"))
    _admit(orch, None)
    # a read like a page of catching up, in a turn (``Hub.turns``): a burst of streams
    # opened at once (dashboards back after a restart) reads the runs a few at a time, with
    # other requests between them (measured: 500 at once held a request up to 0.7 s)
    async with orch.hub.turns, orch.db.read() as session:
        await get_run(session, run_id=run_id)
    return _response(orch, principal, follow_run(orch, run_id, start))
