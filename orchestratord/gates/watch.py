"""When a waiting gate evaluates again: when what it reads may have changed.

A waiting gate follows its run's events in this process (the hub's run channel). Most of
those are tokens of the run's engine steps, which change nothing a gate reads, and an
evaluation reads up to thousands of facts: so the gate looks at what woke it. ``fact``
events and steps' ends (a step's own facts are stored with its end, and its usage settles
then) are news; so are a poke (another process appended to the run), a tail the channel
no longer holds, and the poll every ``poll_s`` (another process's facts, where no wake-up
reaches here). News is confirmed by the run's fingerprint (``facts.read_fingerprint``,
one small query): the gate evaluates again only when it changed. Evaluations are paced: the
next starts no sooner than ``PACE`` times the last one's read of the facts (the part that
runs on the event loop) after it, so gates over thousands of facts, with facts arriving
fast, hold the loop at most a fifth of the time (news meanwhile is taken in by the next
evaluation).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from orchestrator_core import clock
from orchestrator_core.event_order import TERMINAL_TYPES
from orchestratord.db.engine import Database
from orchestratord.gates.facts import read_fingerprint
from orchestratord.streams.hub import Channel

NEWS = frozenset({"fact", *(t.value for t in TERMINAL_TYPES)})
PACE = 4.0


class FactWatch:
    def __init__(self, channel: Channel, db: Database, run_id: str, poll_s: float) -> None:
        self._channel = channel
        self._db = db
        self._run_id = run_id
        self._poll_s = poll_s
        self._cursor = channel.last + 1
        self._pokes = channel.foreign
        self._seen: tuple[Any, ...] | None = None
        self._next_at = 0.0

    def evaluated(self, fingerprint: tuple[Any, ...], cost_s: float) -> None:
        """The gate evaluated what ``fingerprint`` names, having spent ``cost_s`` of the
        event loop's time reading it."""
        self._seen = fingerprint
        self._next_at = clock.clock.monotonic() + PACE * cost_s

    async def changed(self, stop: asyncio.Event, ends_at: float) -> bool:
        """Wait until what the gate reads changed (True), or until ``ends_at`` or ``stop``
        with nothing changed (False)."""
        while not stop.is_set():
            left = ends_at - clock.clock.monotonic()
            woke = left > 0 and await self._wait(stop, min(left, self._poll_s))
            if stop.is_set():
                return False
            if (not woke or self._news()) and await self._fingerprint_moved():
                return await self._paced(stop, ends_at)
            if left <= 0:
                return False
        return False

    async def _paced(self, stop: asyncio.Event, ends_at: float) -> bool:
        """True once the pace allows the next evaluation (at ``ends_at`` at the latest)."""
        wait = min(self._next_at, ends_at) - clock.clock.monotonic()
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await stop.wait()
        return not stop.is_set()

    async def _wait(self, stop: asyncio.Event, timeout: float) -> bool:
        """True when the channel woke (an event, a poke), False after ``timeout``."""
        chan = self._channel
        if chan.closed:  # shutting down: it would wake at once, forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await stop.wait()
            return False
        stopped = asyncio.ensure_future(stop.wait())
        woke = asyncio.ensure_future(chan.wait(self._cursor, timeout))
        try:
            await asyncio.wait({stopped, woke}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            woke.cancel()
        return woke.done() and not woke.cancelled() and woke.result()

    def _news(self) -> bool:
        """Whether the events since the last look may change what the gate reads."""
        chan = self._channel
        events = chan.take(self._cursor, max(chan.size, 1))
        poked = chan.foreign != self._pokes
        self._pokes = chan.foreign
        self._cursor = max(self._cursor, chan.last + 1)
        return events is None or poked or any(ev.type in NEWS for ev in events)

    async def _fingerprint_moved(self) -> bool:
        return await read_fingerprint(self._db, self._run_id) != self._seen
