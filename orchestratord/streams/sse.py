"""Followers: cursors over a step's or a run's event log that also follow live appends.

A follower serves from the hub's in-memory tail while it keeps up, and from the database
when it is behind or when the writer is another process; either way it resumes at an exact
cursor, so a reconnecting client sees no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import math
import operator
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Protocol, TypedDict, TypeVar

import orjson

from orchestratord.db.outage import unavailable
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
KEEPALIVE = b": keep-alive\n\n"
# keep-alives fall due on this grid, so an idle process wakes a few times a second for all its
# streams' keep-alives together, not once for each stream (10,000 idle streams at the default
# 15 s: 4.5% -> 2.4% of a core)
KEEPALIVE_GRID_S = 0.25
# a page of catching up carries at most this much event data (and ``read_batch`` events): what
# a stream holds in memory beyond its socket's buffers while its client does not read
PAGE_BYTES = 256 * 1024
# a stream whose read found the database unavailable reads again this often (at most)
OUTAGE_RETRY_S = 0.5
_DATA = operator.attrgetter("data")
EndedBefore = Callable[[int], Awaitable[bool]]
_IDLE_WAIT_S = 300.0  # a caught-up follower that every relevant commit wakes looks anyway
Frame = TypeVar("Frame")
Frame_co = TypeVar("Frame_co", covariant=True)


class Narrator(Protocol[Frame_co]):
    """What a follower says of a step while nothing happens (its place in a queue)."""

    active: bool
    poll_s: float

    def __call__(self) -> Awaitable[Frame_co | None]: ...


def encode_frames(events: list[LogEvent], *, run_cursor: bool) -> bytes:
    parts = []
    for ev in events:
        cursor = ev.run_seq if run_cursor else (ev.seq or 0)
        parts.append(b"id: %d\nevent: %s\ndata: %s\n\n" % (cursor, ev.type.encode(), ev.data))
    return b"".join(parts)


async def _follow(
    subscribe: Callable[[], Channel],
    read: Reader,
    cursor: int,
    *,
    run_cursor: bool,
    batch: int,
    poll_s: float,
    keepalive_s: float,
    on_close: Callable[[Channel, bool], object],
    encode: Callable[[list[LogEvent]], Frame],
    keepalive: Frame | None,
    ended_before: EndedBefore | None = None,
    narrate: Narrator[Frame] | None = None,
    turns: asyncio.Semaphore | None = None,
) -> AsyncIterator[Frame]:
    # The log is read at the start, when the live tail cannot serve the cursor, when another
    # process poked the channel (it appended here), and after a quiet wait of ``poll_s``.
    # With wake-ups (or one process, SQLite) ``poll_s`` is long: idle followers sleep. After
    # ``keepalive_s`` without a frame, a keep-alive comment goes out (the response has no
    # timer of its own). ``on_close(channel, ended)`` runs when it stops (``ended``: it sent
    # the end, or the cursor was past it);
    # the response iterates this generator itself: a wrapper generator would cost every
    # frame and every keep-alive a step more.
    # Catching up goes a page at a time (``batch`` events, at most ``PAGE_BYTES``): each
    # read of the log, and each full page of the tail, in one of the process's ``turns``
    # (``Hub.turns``; without them, turns of its own), and the loop runs its other ready
    # callbacks after each full page sent. A page is all a stream holds beyond its socket's
    # buffers: the response's send waits for a slow client's socket to drain, and meanwhile
    # the follower reads nothing more (no event is dropped: it goes on at its cursor, from
    # the tail or from the log).
    # the channel's poke count at our last read of the log; -1: read now (a whole channel
    # holds what the log holds while its tail reaches back to the cursor)
    if turns is None:
        turns = asyncio.Semaphore()
    channel = subscribe()  # on the first frame asked for: a stream never started holds none
    ended = False
    try:
        seen = channel.foreign if channel.whole else -1
        clock = asyncio.get_running_loop().time
        ping_at = keepalive_due(clock(), keepalive_s)
        look_at: float | None = None  # when the current quiet wait ends
        while True:
            if channel.closed:  # shutting down: the client resumes elsewhere at its cursor
                return
            taken = channel.take(cursor, batch)
            if taken == [] and channel.ended_before(cursor):
                ended = True  # resumed after the terminal event: nothing follows
                return
            frame: Frame | None = None
            away = False  # the database could not be read (down, restarting)
            if taken is None or (not taken and seen != channel.foreign):
                seen = channel.foreign
                async with turns:
                    try:
                        events, full = _bounded(await read(cursor, batch), batch)
                    except Exception as exc:
                        if unavailable(exc) is None:
                            raise
                        events, full, away = [], False, True  # read again after a wait
                    if events:
                        frame = encode(events)
                if full:  # the log may hold more: the tail cannot tell, read on
                    seen = -1
                told = not (events or away) and ended_before is not None
                if told and ended_before is not None and await ended_before(cursor):
                    ended = True  # resumed after the terminal event: nothing follows
                    return
            else:
                events, full = _bounded(taken, batch)
                if full:  # far behind the tail's end: a page of catching up, in a turn
                    async with turns:
                        frame = encode(events)
                elif events:
                    frame = encode(events)
            if frame is not None:
                last = events[-1]
                # while the frame is sent (a slow client's socket: as long as it takes), the
                # stream holds its bytes alone, not the page's hundreds of events: objects
                # that the collector would otherwise walk, for every stream that waits
                del events, taken
                yield frame
                ping_at = keepalive_due(clock(), keepalive_s)
                look_at = None
                cursor = (last.run_seq if run_cursor else (last.seq or 0)) + 1
                if last.terminal if not run_cursor else last.type == RUN_END:
                    ended = True
                    return
                if full:  # the loop's other ready work goes before the next page
                    await asyncio.sleep(0)
                continue
            # a queued step is told where it waits after a quiet wait (not at the start: most
            # steps start at once, and a stream's start is on the time-to-first-token path)
            waiting = narrate if narrate is not None and narrate.active else None
            quiet = poll_s if waiting is None else min(poll_s, waiting.poll_s)
            if away:  # keep-alives go on meanwhile; the client keeps its connection
                quiet, look_at = min(quiet, OUTAGE_RETRY_S), None
            now = clock()
            if now >= ping_at:
                if keepalive is not None:
                    yield keepalive
                ping_at = keepalive_due(now, keepalive_s)
            if look_at is None:
                look_at = now + quiet
            if now < look_at:
                if await channel.wait(cursor, min(look_at, ping_at) - now):
                    look_at = None  # something came: the quiet wait starts over
                    if not channel.whole:  # if the tail has nothing at the cursor, the log tells
                        seen = -1
                continue
            look_at = None
            seen = -1  # a quiet wait: look in the log again
            if waiting is not None and (frame := await waiting()):
                yield frame
                ping_at = keepalive_due(clock(), keepalive_s)
    finally:
        on_close(channel, ended)


def _bounded(events: list[LogEvent], batch: int) -> tuple[list[LogEvent], bool]:
    """The events of one page (at most ``PAGE_BYTES`` of data, one event at least), and
    whether it is full: more may follow at once."""
    if len(events) > 1 and sum(map(len, map(_DATA, events))) > PAGE_BYTES:
        size = 0
        for i, ev in enumerate(events):
            size += len(ev.data)
            if size > PAGE_BYTES:
                return events[: max(i, 1)], True
    return events, len(events) >= batch


def keepalive_due(now: float, keepalive_s: float) -> float:
    """When a stream whose last frame went out at ``now`` sends a keep-alive: ``keepalive_s``
    later, brought back to the grid (never later; less than a grid step earlier)."""
    grid = min(KEEPALIVE_GRID_S, keepalive_s / 2)
    return math.floor((now + keepalive_s) / grid) * grid


class QueueNarration:
    """A queued step's place in its queue, said after each quiet wait while it waits: a
    frame without ``id``, not stored. Inactive once the step has left the queue."""

    def __init__(self, orch: Orchestrator, step_id: str) -> None:
        self._orch = orch
        self._step_id = step_id
        self._said: str | None = None
        self.active = True
        self.poll_s = orch.settings.stream.poll_s

    async def __call__(self) -> bytes | None:
        text = None
        if not self._orch.hub.runs_here(self._step_id):  # else no read: it left its queue
            async with self._orch.db.read() as session:
                text = await queue_narration(session, step_id=self._step_id)
        if text is None:
            self.active = False  # a step never queues again
            return None
        if text == self._said:
            return None
        self._said = text
        body = orjson.dumps(
            {"step_id": self._step_id, "seq": None, "type": "narration", "text": text}
        )
        return b"event: narration\ndata: %s\n\n" % body


def _poll_s(orch: Orchestrator) -> float:
    """How long a caught-up follower sleeps before it looks in the log anyway: long when
    every commit that concerns it wakes it (one process, or live wake-ups)."""
    wakeups = orch.wakeups
    if orch.db.is_sqlite or (wakeups is not None and wakeups.live):
        return _IDLE_WAIT_S
    return orch.settings.stream.poll_s


class _Pacing(TypedDict):
    batch: int
    poll_s: float
    keepalive_s: float
    turns: asyncio.Semaphore


def _pacing(orch: Orchestrator) -> _Pacing:
    """How a follower of this service reads and waits (``_follow``'s settings)."""
    settings = orch.settings.stream
    return {
        "batch": settings.read_batch,
        "poll_s": _poll_s(orch),
        "keepalive_s": settings.keepalive_s,
        "turns": orch.hub.turns,
    }


def follow_step(
    orch: Orchestrator, step_id: str, from_seq: int, *, cancel_on_disconnect: bool
) -> AsyncIterator[bytes]:
    def on_close(channel: Channel, ended: bool) -> None:
        remaining = orch.hub.unsubscribe_step(step_id)
        if cancel_on_disconnect and remaining == 0 and not ended and not channel.closed:
            orch.cancel_step_soon(step_id)

    return _follow_step(
        orch,
        step_id,
        from_seq,
        on_close=on_close,
        encode=partial(encode_frames, run_cursor=False),
        keepalive=KEEPALIVE,
        narrate=QueueNarration(orch, step_id),
    )


def step_events(
    orch: Orchestrator, step_id: str, from_seq: int = 0
) -> AsyncIterator[list[LogEvent]]:
    """A step's events in batches, from ``from_seq`` to its end, as its stream sends them
    (for a front door other than SSE: no keep-alives, no queue narration)."""
    return _follow_step(
        orch,
        step_id,
        from_seq,
        on_close=lambda _channel, _ended: orch.hub.unsubscribe_step(step_id),
        encode=list,
        keepalive=None,
    )


def _follow_step(
    orch: Orchestrator,
    step_id: str,
    from_seq: int,
    *,
    on_close: Callable[[Channel, bool], object],
    encode: Callable[[list[LogEvent]], Frame],
    keepalive: Frame | None,
    narrate: Narrator[Frame] | None = None,
) -> AsyncIterator[Frame]:
    async def read(cursor: int, limit: int) -> list[LogEvent]:
        return await read_step_events(orch.db, step_id, cursor, limit)

    async def ended_before(cursor: int) -> bool:
        return await step_ended_before(orch.db, step_id, cursor)

    return _follow(
        lambda: orch.hub.subscribe_step(step_id),
        read,
        from_seq,
        run_cursor=False,
        **_pacing(orch),
        on_close=on_close,
        encode=encode,
        keepalive=keepalive,
        ended_before=ended_before,
        narrate=narrate,
    )


def follow_run(orch: Orchestrator, run_id: str, from_run_seq: int) -> AsyncIterator[bytes]:
    async def read(cursor: int, limit: int) -> list[LogEvent]:
        return await read_run_events(orch.db, run_id, cursor, limit)

    async def ended_before(cursor: int) -> bool:
        return await run_ended_before(orch.db, run_id, cursor)

    return _follow(
        lambda: orch.hub.subscribe_run(run_id),
        read,
        from_run_seq,
        run_cursor=True,
        **_pacing(orch),
        on_close=lambda _channel, _ended: orch.hub.unsubscribe_run(run_id),
        encode=partial(encode_frames, run_cursor=True),
        keepalive=KEEPALIVE,
        ended_before=ended_before,
    )
