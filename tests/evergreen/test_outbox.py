"""The session's outbox: bounded, its room what the session's steps wait on, its end."""

from __future__ import annotations

import asyncio

from orchestratord.evergreen.outbox import DONE, Outbox


async def test_a_full_outbox_holds_its_producers_and_its_steps_until_one_is_taken() -> None:
    box = Outbox(2)
    await box.put("a")
    await box.put("b")
    put = asyncio.create_task(box.put("c"))
    room = asyncio.create_task(box.room())
    await asyncio.sleep(0)
    assert not put.done() and not room.done() and len(box) == 2
    assert await box.get() == "a"
    await asyncio.gather(put, room)
    assert [await box.get(), await box.get()] == ["b", "c"]


async def test_the_end_comes_after_what_waits_unless_it_is_dropped() -> None:
    box = Outbox(4)
    await box.put("a")
    box.end()
    await box.put("late")  # nothing is put after the end
    assert [await box.get(), await box.get()] == ["a", DONE]
    dropped = Outbox(1)
    await dropped.put("a")
    waiting = asyncio.create_task(dropped.put("b"))
    await asyncio.sleep(0)
    dropped.end(drop=True)  # the producer and any step waiting for room go on
    await waiting
    await dropped.room()
    assert await dropped.get() is DONE
