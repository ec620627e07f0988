"""SQLite's one write lock serves the work of accepted steps before new submissions."""

from __future__ import annotations

import asyncio

import pytest

from orchestratord.db.engine import WriteLock


async def test_urgent_waiters_go_first_fifo_within_each_class() -> None:
    lock = WriteLock()
    order: list[str] = []
    await lock.acquire()

    async def take(name: str, urgent: bool) -> None:
        await lock.acquire(urgent=urgent)
        order.append(name)
        await asyncio.sleep(0)
        lock.release()

    tasks = []
    for name, urgent in (("api1", False), ("writer1", True), ("api2", False), ("writer2", True)):
        tasks.append(asyncio.create_task(take(name, urgent)))
        await asyncio.sleep(0)  # queued in this order
    lock.release()
    await asyncio.gather(*tasks)
    assert order == ["writer1", "writer2", "api1", "api2"]
    assert not lock.locked


async def test_a_cancelled_waiter_neither_holds_nor_loses_the_lock() -> None:
    lock = WriteLock()
    await lock.acquire()
    waiting = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    lock.release()
    assert not lock.locked  # the cancelled waiter was not handed the lock

    # handed the lock at the moment it is cancelled: it passes the lock on
    await lock.acquire()
    first = asyncio.create_task(lock.acquire())
    second = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    lock.release()  # hands over to `first`...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # `second` got it
    assert lock.locked
    lock.release()
    assert not lock.locked


async def test_a_waiter_cancelled_as_the_lock_is_released_ends_cancelled() -> None:
    """Its future is cancelled at once, its handler runs a turn later: a release in between
    drops the cancelled future from the queue. The waiter still ends cancelled (a task being
    stopped stops: with any other error its loop could go on and never end) and the lock
    is free."""
    lock = WriteLock()
    await lock.acquire()
    waiting = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    waiting.cancel()
    lock.release()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not lock.locked
    await asyncio.wait_for(lock.acquire(), 1)
