"""Live fan-out of committed events to stream followers, in memory, per process.

A :class:`Channel` exists only while someone follows it. It keeps a bounded, contiguous tail
of recent events; a follower whose cursor is older than that tail reads the log in the
database instead, so a slow reader costs bounded memory and loses nothing. Events written
by another process never reach this hub: a wake-up from that process (PostgreSQL NOTIFY,
``streams/wakeups.py``) pokes the channel, and its followers read the log.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Callable

from orchestratord.eventlog import LogEvent


class Channel:
    __slots__ = ("_buf", "_cursor", "_waiters", "closed", "foreign", "last", "refs")

    def __init__(self, cursor: Callable[[LogEvent], int], maxlen: int) -> None:
        self._cursor = cursor
        self._buf: deque[LogEvent] = deque(maxlen=maxlen)
        self._waiters: set[asyncio.Future[None]] = set()
        self.last = -1
        self.refs = 0
        self.foreign = 0  # pokes: another process appended events here (read the log)
        self.closed = False  # the process is shutting down: followers end, clients resume

    def close(self) -> None:
        self.closed = True
        self._wake()

    def publish(self, events: list[LogEvent]) -> None:
        for ev in events:
            cur = self._cursor(ev)
            if cur <= self.last:
                continue
            if self._buf and cur != self.last + 1:
                self._buf.clear()  # a gap (foreign writer): only contiguous tails are served
            self._buf.append(ev)
            self.last = cur
        self._wake()

    def poke(self) -> None:
        """Another process appended events to this key: followers read the log."""
        self.foreign += 1
        self._wake()

    def _wake(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    def take(self, cursor: int, limit: int) -> list[LogEvent] | None:
        """Events from ``cursor`` on, or None when the tail cannot tell (read the log)."""
        if not self._buf:
            # nothing published here since it was opened: nothing new, unless the cursor is
            # behind what was published (and evicted)
            return [] if cursor > self.last else None
        first = self._cursor(self._buf[0])
        if cursor < first:
            return None
        start = cursor - first
        if start >= len(self._buf):
            return []
        end = min(len(self._buf), start + limit)
        return [self._buf[i] for i in range(start, end)]

    async def wait(self, cursor: int, timeout: float) -> bool:
        """Wait for an event at ``cursor`` or later, or a poke; False when ``timeout`` passed
        first."""
        if self.last >= cursor:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return False
        finally:
            self._waiters.discard(fut)
        return True


def _step_cursor(ev: LogEvent) -> int:
    return ev.seq if ev.seq is not None else -1


def _run_cursor(ev: LogEvent) -> int:
    return ev.run_seq


class Hub:
    def __init__(self, *, buffer_events: int = 4096) -> None:
        self._buffer = buffer_events
        self._steps: dict[str, Channel] = {}
        self._runs: dict[str, Channel] = {}
        self.closed = False

    def close_all(self) -> None:
        """End every stream (shutdown): each follower returns, and its client resumes on
        another process with ``Last-Event-ID``; streams opened later end at once."""
        self.closed = True
        for chan in [*self._steps.values(), *self._runs.values()]:
            chan.close()

    def publish(self, events: list[LogEvent]) -> None:
        if not self._steps and not self._runs:
            return
        by_step: dict[str, list[LogEvent]] = defaultdict(list)
        by_run: dict[str, list[LogEvent]] = defaultdict(list)
        for ev in events:
            if ev.step_id is not None and ev.step_id in self._steps:
                by_step[ev.step_id].append(ev)
            if ev.run_id in self._runs:
                by_run[ev.run_id].append(ev)
        for key, evs in by_step.items():
            self._steps[key].publish(evs)
        for key, evs in by_run.items():
            self._runs[key].publish(evs)

    def poke(self, keys: list[str]) -> None:
        """Wake the followers of ``keys`` (``s:<step_id>``, ``r:<run_id>``) to read the log."""
        for key in keys:
            table = self._steps if key.startswith("s:") else self._runs
            chan = table.get(key[2:])
            if chan is not None:
                chan.poke()

    def poke_all(self) -> None:
        for chan in [*self._steps.values(), *self._runs.values()]:
            chan.poke()

    def subscribe_step(self, step_id: str) -> Channel:
        return self._subscribe(self._steps, step_id, _step_cursor)

    def unsubscribe_step(self, step_id: str) -> int:
        return self._unsubscribe(self._steps, step_id)

    def subscribe_run(self, run_id: str) -> Channel:
        return self._subscribe(self._runs, run_id, _run_cursor)

    def unsubscribe_run(self, run_id: str) -> int:
        return self._unsubscribe(self._runs, run_id)

    def open_streams(self) -> int:
        return sum(self.subscribers().values())

    def subscribers(self) -> dict[str, int]:
        """Open streams by what they follow."""
        return {
            "step": sum(c.refs for c in self._steps.values()),
            "run": sum(c.refs for c in self._runs.values()),
        }

    def followers(self, step_id: str) -> int:
        chan = self._steps.get(step_id)
        return chan.refs if chan else 0

    def _subscribe(
        self, table: dict[str, Channel], key: str, cursor: Callable[[LogEvent], int]
    ) -> Channel:
        chan = table.get(key)
        if chan is None:
            chan = table[key] = Channel(cursor, self._buffer)
            chan.closed = self.closed
        chan.refs += 1
        return chan

    @staticmethod
    def _unsubscribe(table: dict[str, Channel], key: str) -> int:
        chan = table.get(key)
        if chan is None:
            return 0
        chan.refs -= 1
        if chan.refs <= 0:
            del table[key]
            return 0
        return chan.refs
