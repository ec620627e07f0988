"""What an idle stream costs: no tail until something is published, one waiter entry while
it waits, headers encoded once for all streams, keep-alives that fall due together."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestratord.api.app import create_app
from orchestratord.eventlog import LogEvent, make_event
from orchestratord.runtime import Orchestrator
from orchestratord.streams.hub import Channel, Hub
from orchestratord.streams.response import RAW_SEND, EventStreamResponse
from orchestratord.streams.routes import SSE_HEADERS
from orchestratord.streams.sse import KEEPALIVE_GRID_S, _follow, keepalive_due
from test_harness.servers import serve_app
from tests.helpers import make_run, submit


def test_an_idle_channel_holds_no_tail_until_an_event_comes() -> None:
    hub = Hub()
    chan = hub.subscribe_run("r")
    assert chan.size == 0 and chan.take(0, 10) == []
    ev = make_event("r", None, None, "run_end", {})
    ev.run_seq = 0
    hub.publish([ev])
    assert chan.take(0, 10) == [ev]


async def test_a_waiter_is_removed_whether_woken_or_timed_out() -> None:
    hub = Hub()
    chan = hub.subscribe_run("r")
    assert await chan.wait(0, 0.01) is False
    assert chan._waiters == []
    waiting = asyncio.create_task(chan.wait(0, 5.0))
    await asyncio.sleep(0)
    ev = make_event("r", None, None, "run_end", {})
    ev.run_seq = 0
    hub.publish([ev])
    assert await waiting is True
    assert chan._waiters == []


def test_a_keepalive_falls_due_on_the_grid_never_later_than_asked() -> None:
    for keepalive_s, grid in ((15.0, KEEPALIVE_GRID_S), (0.2, 0.1)):
        for now in (0.0, 0.01, 1234.5678, 99999.99, 1e6 + 0.13):
            due = keepalive_due(now, keepalive_s)
            assert now + keepalive_s - grid < due <= now + keepalive_s
            assert abs(due / grid - round(due / grid)) < 1e-6


class _OneWait(Channel):
    """A run's channel whose first wait is noted and ends its follower: the wait's deadline
    lies between (when the follower began, when it waited) plus the timeout it asked."""

    __slots__ = ("began", "waits")

    def __init__(self, waits: list[tuple[float, float]]) -> None:
        super().__init__(lambda ev: ev.run_seq or 0, 16)
        self.waits = waits
        self.began = 0.0

    async def wait(self, cursor: int, timeout: float) -> bool:
        self.waits.append((self.began + timeout, asyncio.get_running_loop().time() + timeout))
        raise asyncio.CancelledError


async def test_idle_followers_that_went_quiet_apart_wait_for_the_same_keepalive_times() -> None:
    """Each idle follower waits until its next keep-alive; those times lie on one grid, so
    the loop wakes for many streams' keep-alives at once, not for each stream apart."""
    loop = asyncio.get_running_loop()
    waits: list[tuple[float, float]] = []

    async def read(cursor: int, limit: int) -> list[LogEvent]:
        return []

    for _ in range(5):
        chan = _OneWait(waits)
        chan.began = loop.time()
        follower = _follow(
            lambda chan=chan: chan,  # type: ignore[misc]
            read,
            0,
            run_cursor=True,
            batch=64,
            poll_s=300.0,
            keepalive_s=15.0,
            on_close=lambda _c, _e: None,
            encode=list,
            keepalive=None,
        )
        with pytest.raises(asyncio.CancelledError):
            await follower.__anext__()
        await asyncio.sleep(0.013)
    assert len(waits) == 5
    instants = set()
    grid = KEEPALIVE_GRID_S
    for earliest, latest in waits:
        # the grid's first instant from the earliest the deadline can be is the deadline
        # (a time off the grid would fall in that short span only by chance)
        instant = math.ceil(earliest / grid - 1e-9) * grid
        assert instant <= latest + 1e-9
        instants.add(round(instant / grid))
    # five followers that went quiet within about 65 ms wait for at most two instants
    assert len(instants) <= 2


async def test_stream_responses_share_their_encoded_headers() -> None:
    async def frames() -> object:
        yield b""

    one = EventStreamResponse(frames(), headers=SSE_HEADERS)  # type: ignore[arg-type]
    two = EventStreamResponse(frames(), headers=SSE_HEADERS)  # type: ignore[arg-type]
    assert one.raw_headers is two.raw_headers
    assert (b"content-type", b"text/event-stream; charset=utf-8") in one.raw_headers
    with pytest.raises(AttributeError):  # shared, so it cannot be changed for one response
        one.raw_headers.append((b"x", b"y"))


async def test_a_streams_frames_go_to_the_servers_send_past_the_middlewares() -> None:
    """The middlewares look at a response's start; its frames (an idle stream's keep-alives)
    go to the server's ``send`` the app put in the scope."""

    async def frames() -> AsyncIterator[bytes]:
        yield b": keep-alive\n\n"
        yield b"id: 0\ndata: {}\n\n"

    wrapped: list[str] = []
    raw: list[bytes] = []

    async def middleware_send(message: Message) -> None:
        wrapped.append(message["type"])

    async def server_send(message: Message) -> None:
        raw.append(message["body"])

    async def receive() -> Message:
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    response = EventStreamResponse(frames(), headers=SSE_HEADERS)
    scope = {"type": "http", RAW_SEND: server_send}
    await response(scope, receive, middleware_send)
    assert wrapped == ["http.response.start"]
    assert raw == [b": keep-alive\n\n", b"id: 0\ndata: {}\n\n", b""]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_the_app_hands_its_servers_send_to_stream_responses(
    orch: Orchestrator,
) -> None:
    """Through the whole app: the start still passes the middlewares (its correlation id),
    the frames reach the client, and a middleware around the routes sees no frame."""
    seen: list[str] = []
    app = create_app(orchestrator=orch)

    def counting(inner: ASGIApp) -> ASGIApp:
        async def call(scope: Scope, receive: Receive, send: Send) -> None:
            async def counted(message: Message) -> None:
                if scope["path"].endswith("/stream"):
                    seen.append(message["type"])
                await send(message)

            await inner(scope, receive, counted)

        return call

    app.add_middleware(counting)
    async with (
        serve_app(app) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        run_id = await make_run(c)
        step_id = (await submit(c, run_id, token="a", max_tokens=3)).json()["step_id"]
        async with c.stream("GET", f"/v1/steps/{step_id}/stream") as r:
            assert r.headers["x-correlation-id"]
            body = b"".join([chunk async for chunk in r.aiter_bytes()])
    assert body.count(b"event: token") == 3 and b"event: end" in body
    assert seen == ["http.response.start"]
