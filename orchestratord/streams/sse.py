"""Followers: cursors over a step's or a run's event log that also follow live appends.

A follower serves from the hub's in-memory tail while it keeps up, and from the database
when it is behind or when the writer is another process; either way it resumes at an exact
cursor, so a reconnecting client sees no gap and no duplicate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import orjson

from orchestratord.eventlog import (
    RUN_END,
    LogEvent,
    read_run_events,
    read_step_events,
    run_ended_before,
    step_ended_before,
)
from orchestratord.runtime import Orchestrator
from orchestratord.steps.queries import queue_narration
from orchestratord.streams.hub import Channel

Reader = Callable[[int, int], Awaitable[list[LogEvent]]]
EndedBefore = Callable[[int], Awaitable[bool]]
Narrate = Callable[[], Awaitable[bytes | None]]
_IDLE_WAIT_S = 60.0


def encode_frames(events: list[LogEvent], *, run_cursor: bool) -> bytes:
    parts = []
    for ev in events:
        cursor = ev.run_seq if run_cursor else (ev.seq or 0)
        parts.append(b"id: %d\nevent: %s\ndata: %s\n\n" % (cursor, ev.type.encode(), ev.data))
    return b"".join(parts)


async def _follow(
    channel: Channel,
    read: Reader,
    cursor: int,
    *,
    run_cursor: bool,
    batch: int,
    poll_s: float,
    state: dict[str, bool],
    ended_before: EndedBefore | None = None,
    narrate: Narrate | None = None,
    foreign_writers: bool = True,
) -> AsyncIterator[bytes]:
    # The log is read at the start, when the live tail cannot serve the cursor, and after a
    # quiet wait when other processes may write (PostgreSQL). A SQLite deployment is one
    # process whose every commit reaches the hub: its idle followers never touch the database.
    look_in_log = True
    while True:
        events = channel.take(cursor, batch)
        if events is None or (not events and look_in_log):
            look_in_log = False
            events = await read(cursor, batch)
            if not events and ended_before is not None and await ended_before(cursor):
                state["ended"] = True  # resumed after the terminal event: nothing follows
                return
        if events:
            yield encode_frames(events, run_cursor=run_cursor)
            last = events[-1]
            cursor = (last.run_seq if run_cursor else (last.seq or 0)) + 1
            if last.terminal if not run_cursor else last.type == RUN_END:
                state["ended"] = True
                return
            continue
        # nothing to look for after a quiet wait: sleep until woken (keep-alives are sent
        # by the response itself)
        timeout = poll_s if foreign_writers or narrate is not None else _IDLE_WAIT_S
        quiet = not await channel.wait(cursor, timeout)
        look_in_log = quiet and foreign_writers
        # a step still waiting after a quiet poll is told where it waits (not at the start:
        # most steps start within a poll, and a stream's start is on the TTFT path)
        if quiet and narrate is not None and (frame := await narrate()):
            yield frame


async def follow_step(
    orch: Orchestrator, step_id: str, from_seq: int, *, cancel_on_disconnect: bool
) -> AsyncIterator[bytes]:
    settings = orch.settings.stream
    channel = orch.hub.subscribe_step(step_id)
    state = {"ended": False}

    async def read(cursor: int, limit: int) -> list[LogEvent]:
        return await read_step_events(orch.db, step_id, cursor, limit)

    async def ended_before(cursor: int) -> bool:
        return await step_ended_before(orch.db, step_id, cursor)

    said: list[str] = []
    started = [False]

    async def narrate() -> bytes | None:
        """A queued step's place in its queue: a frame without ``id``, not stored."""
        if started[0]:
            return None  # a step never queues again
        async with orch.db.read() as session:
            text = await queue_narration(session, step_id=step_id)
        if text is None:
            started[0] = True
            return None
        if said and said[-1] == text:
            return None
        said.append(text)
        body = orjson.dumps({"step_id": step_id, "seq": None, "type": "narration", "text": text})
        return b"event: narration\ndata: %s\n\n" % body

    try:
        async for chunk in _follow(
            channel,
            read,
            from_seq,
            run_cursor=False,
            batch=settings.read_batch,
            poll_s=settings.poll_s,
            state=state,
            ended_before=ended_before,
            narrate=narrate,
            foreign_writers=not orch.db.is_sqlite,
        ):
            yield chunk
    finally:
        remaining = orch.hub.unsubscribe_step(step_id)
        if cancel_on_disconnect and remaining == 0 and not state["ended"]:
            orch.cancel_step_soon(step_id)


async def follow_run(orch: Orchestrator, run_id: str, from_run_seq: int) -> AsyncIterator[bytes]:
    settings = orch.settings.stream
    channel = orch.hub.subscribe_run(run_id)

    async def read(cursor: int, limit: int) -> list[LogEvent]:
        return await read_run_events(orch.db, run_id, cursor, limit)

    async def ended_before(cursor: int) -> bool:
        return await run_ended_before(orch.db, run_id, cursor)

    try:
        async for chunk in _follow(
            channel,
            read,
            from_run_seq,
            run_cursor=True,
            batch=settings.read_batch,
            poll_s=settings.poll_s,
            state={"ended": False},
            ended_before=ended_before,
            foreign_writers=not orch.db.is_sqlite,
        ):
            yield chunk
    finally:
        orch.hub.unsubscribe_run(run_id)
