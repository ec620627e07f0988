"""What an idle stream costs: no tail until something is published, one waiter entry while
it waits, headers encoded once for all streams."""

from __future__ import annotations

import asyncio

import pytest

from orchestratord.eventlog import make_event
from orchestratord.streams.hub import Hub
from orchestratord.streams.response import EventStreamResponse
from orchestratord.streams.routes import SSE_HEADERS


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


async def test_stream_responses_share_their_encoded_headers() -> None:
    async def frames() -> object:
        yield b""

    one = EventStreamResponse(frames(), headers=SSE_HEADERS)  # type: ignore[arg-type]
    two = EventStreamResponse(frames(), headers=SSE_HEADERS)  # type: ignore[arg-type]
    assert one.raw_headers is two.raw_headers
    assert (b"content-type", b"text/event-stream; charset=utf-8") in one.raw_headers
    with pytest.raises(AttributeError):  # shared, so it cannot be changed for one response
        one.raw_headers.append((b"x", b"y"))
