"""The hub's channels alone: what a follower's wait returns when the process shuts down."""

from __future__ import annotations

import asyncio

from orchestratord.streams.hub import Hub


async def test_a_wait_after_the_close_returns_at_once() -> None:
    """A follower reading the log (not waiting) when every stream is ended must not then wait
    out its quiet period: its next wait returns, and its loop sees the channel closed."""
    hub = Hub()
    chan = hub.subscribe_step("step_a")
    hub.close_all()  # while the follower was away from its wait
    woken = await asyncio.wait_for(chan.wait(cursor=0, timeout=30.0), 1.0)
    assert woken is True and chan.closed


async def test_a_waiting_follower_is_woken_by_the_close() -> None:
    hub = Hub()
    chan = hub.subscribe_step("step_a")
    waiting = asyncio.create_task(chan.wait(cursor=0, timeout=30.0))
    await asyncio.sleep(0)  # it waits now
    hub.close_all()
    assert await asyncio.wait_for(waiting, 1.0) is True


async def test_an_open_channel_waits_its_timeout() -> None:
    hub = Hub()
    chan = hub.subscribe_step("step_a")
    assert await chan.wait(cursor=0, timeout=0.01) is False
