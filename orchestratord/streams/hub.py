"""Live fan-out of committed events to stream followers, in memory, per process.

A :class:`Channel` exists while someone follows it. It keeps a bounded, contiguous tail
of recent events; a follower whose cursor is older than that tail reads the log in the
database instead, so a slow reader costs bounded memory and loses nothing. Events written
by another process never reach this hub: a wake-up from that process (PostgreSQL NOTIFY,
``streams/wakeups.py``) pokes the channel, and its followers read the log.

A step run by this process is *held* from before its first event commits, so its channel is
``whole``: its tail starts at the step's first event, and a follower that opens it reads
nothing from the database while the tail serves its cursor. After the step ends its channel
is kept a while (the last ``retain_steps`` ended steps, holding ``retain_events`` events in
all), for the client that submits a step and opens its stream once it has already ended: a
burst's last clients open theirs after their steps' hundreds of tokens, and a read of the
log then would cost them round trips to the database at the worst time. A step
submitted here is expected the same way before its submission commits, so a stream opened
while it waits in the queue is whole too.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable

from orchestratord.eventlog import LogEvent


class Channel:
    __slots__ = (
        "_buf",
        "_cursor",
        "_maxlen",
        "_waiters",
        "cancel_on_disconnect",
        "closed",
        "end",
        "foreign",
        "held",
        "last",
        "refs",
        "whole",
    )

    def __init__(self, cursor: Callable[[LogEvent], int], maxlen: int) -> None:
        self._cursor = cursor
        # allocated at the first publish: an empty deque is 760 bytes, and an idle stream's
        # channel may never see an event
        self._buf: deque[LogEvent] | tuple[()] = ()
        self._maxlen = maxlen
        self._waiters: list[asyncio.Future[bool]] = []  # a list of one is a quarter of a set
        self.last = -1
        self.refs = 0  # followers
        self.foreign = 0  # pokes: another process appended events here (read the log)
        self.closed = False  # the process is shutting down: followers end, clients resume
        # Held by the execution of its step, opened before the step's first event committed:
        # every event of the key since its first was published here (``whole``), so while
        # the tail reaches back to a cursor the log has nothing the tail lacks.
        self.held = False
        self.whole = False
        self.end: int | None = None  # cursor of the step's terminal event, once published
        self.cancel_on_disconnect: bool | None = None  # the held step's, for its streams

    def close(self) -> None:
        self.closed = True
        self._wake()

    def publish(self, events: list[LogEvent]) -> None:
        buf = self._buf
        if not isinstance(buf, deque):
            buf = self._buf = deque(maxlen=self._maxlen)
        for ev in events:
            cur = self._cursor(ev)
            if cur <= self.last:
                continue
            if buf and cur != self.last + 1:
                buf.clear()  # a gap (foreign writer): only contiguous tails are served
            buf.append(ev)
            self.last = cur
            if ev.terminal:
                self.end = cur
        self._wake()

    def poke(self) -> None:
        """Another process appended events to this key: followers read the log."""
        self.foreign += 1
        self.whole = False  # the log holds events this tail never saw
        self._wake()

    def ended_before(self, cursor: int) -> bool:
        """A whole channel knows: the key's terminal event lies before ``cursor``."""
        return self.whole and self.end is not None and cursor > self.end

    @property
    def size(self) -> int:
        return len(self._buf)

    def _wake(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(True)
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
        """Wait for an event at ``cursor`` or later, a poke or the channel's close; False when
        ``timeout`` passed first."""
        if self.last >= cursor or self.closed:  # closed while its follower read the log
            return True
        # one future and one timer (``asyncio.wait_for`` adds a coroutine, a callback and a
        # cancellation round per wait: an idle stream waits once per keep-alive)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(fut)
        timer = loop.call_later(timeout, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            if fut in self._waiters:  # woken waiters are gone already
                self._waiters.remove(fut)


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


def _step_cursor(ev: LogEvent) -> int:
    return ev.seq if ev.seq is not None else -1


def _run_cursor(ev: LogEvent) -> int:
    return ev.run_seq


class Hub:
    def __init__(
        self,
        *,
        buffer_events: int = 4096,
        retain_steps: int = 1024,
        retain_events: int = 65536,
        catch_up_turns: int = 1,
    ) -> None:
        self._buffer = buffer_events
        # Turns at catching up (``streams/sse.py``): a stream reads a page of the log, or
        # encodes a full page of its tail, in a turn, first come first served. However many
        # streams are behind, ``catch_up_turns`` pages are in hand at once, so the loop gets
        # back to everything else (requests, live streams, the writer) after that many pages,
        # not after a page of every stream. One where reads run inline on the loop (SQLite:
        # a second could not overlap the first); a few where they wait on the network
        # (PostgreSQL), which also leaves the pool's other connections to requests.
        self.turns = asyncio.Semaphore(catch_up_turns)
        self._steps: dict[str, Channel] = {}
        self._runs: dict[str, Channel] = {}
        # ended steps' whole channels, oldest first, with the events each held when kept:
        # at most ``retain_steps`` of them, holding at most ``retain_events`` in all
        self._retained: OrderedDict[str, tuple[Channel, int]] = OrderedDict()
        self._retained_events = 0
        self._retain_steps = retain_steps
        self._retain_events = retain_events
        self._followers = {"step": 0, "run": 0}
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

    def hold_step(self, step_id: str, *, cancel_on_disconnect: bool, whole: bool) -> Channel:
        """The execution of a step opens its channel before its first event commits
        (``whole``: the step's log is empty; a step run again after its process was lost
        has events this process never published)."""
        self._unretain(step_id)
        chan = self._steps.get(step_id)
        if chan is None:
            chan = self._open(self._steps, step_id, _step_cursor)
            chan.whole = whole
        elif not chan.held:  # followed already: whole if nothing reached it yet
            chan.whole = whole and chan.foreign == 0 and chan.last == -1
        chan.held = True
        chan.cancel_on_disconnect = cancel_on_disconnect
        return chan

    def expect_step(self, step_id: str, *, cancel_on_disconnect: bool) -> None:
        """A step being submitted here, before its submission commits (its log is empty
        until then): its channel is whole from the start, kept among the retained ones until
        its execution holds it or it is followed. Only where every write reaches this hub,
        or pokes it (one process; live wake-ups)."""
        if step_id in self._steps:
            return
        chan = self._open(self._steps, step_id, _step_cursor)
        chan.whole = True
        chan.cancel_on_disconnect = cancel_on_disconnect
        self._retain(step_id, chan)

    def forget_step(self, step_id: str) -> None:
        """The submission that expected it did not commit."""
        chan = self._steps.get(step_id)
        if chan is not None and not chan.held and chan.refs <= 0:
            del self._steps[step_id]
            self._unretain(step_id)

    def _retain(self, step_id: str, chan: Channel) -> None:
        self._unretain(step_id)
        self._retained[step_id] = (chan, chan.size)
        self._retained_events += chan.size
        while (
            len(self._retained) > self._retain_steps or self._retained_events > self._retain_events
        ):
            old_id, (old, size) = self._retained.popitem(last=False)
            self._retained_events -= size
            if old.refs <= 0 and not old.held:
                del self._steps[old_id]

    def _unretain(self, step_id: str) -> None:
        kept = self._retained.pop(step_id, None)
        if kept is not None:
            self._retained_events -= kept[1]

    def release_step(self, step_id: str, *, keep: bool = True) -> None:
        """The execution is over: the channel stays while followed, and afterwards among the
        retained ended steps if it is whole (``keep``: it ended here) and its tail still
        holds the step's first event."""
        chan = self._steps.get(step_id)
        if chan is None or not chan.held:
            return
        chan.held = False
        if not keep:  # let go (another process goes on with it): the log may outgrow the tail
            chan.whole = False
        if chan.whole and chan.size < self._buffer and chan.size <= self._retain_events:
            self._retain(step_id, chan)
        elif chan.refs <= 0:
            del self._steps[step_id]

    def runs_here(self, step_id: str) -> bool:
        """The step's execution in this process holds its channel: it left its queue."""
        chan = self._steps.get(step_id)
        return chan is not None and chan.held

    def known_step(self, step_id: str) -> Channel | None:
        """The whole channel of a step run here (running, or ended and retained)."""
        chan = self._steps.get(step_id)
        return chan if chan is not None and chan.whole else None

    def subscribe_step(self, step_id: str) -> Channel:
        self._followers["step"] += 1
        return self._subscribe(self._steps, step_id, _step_cursor)

    def unsubscribe_step(self, step_id: str) -> int:
        return self._unsubscribe(self._steps, step_id, "step")

    def subscribe_run(self, run_id: str) -> Channel:
        self._followers["run"] += 1
        return self._subscribe(self._runs, run_id, _run_cursor)

    def unsubscribe_run(self, run_id: str) -> int:
        return self._unsubscribe(self._runs, run_id, "run")

    def open_streams(self) -> int:
        return self._followers["step"] + self._followers["run"]

    def subscribers(self) -> dict[str, int]:
        """Open streams by what they follow."""
        return dict(self._followers)

    def followers(self, step_id: str) -> int:
        chan = self._steps.get(step_id)
        return chan.refs if chan else 0

    def _subscribe(
        self, table: dict[str, Channel], key: str, cursor: Callable[[LogEvent], int]
    ) -> Channel:
        chan = table.get(key)
        if chan is None:
            chan = self._open(table, key, cursor)
        chan.refs += 1
        return chan

    def _open(
        self, table: dict[str, Channel], key: str, cursor: Callable[[LogEvent], int]
    ) -> Channel:
        chan = table[key] = Channel(cursor, self._buffer)
        chan.closed = self.closed  # opened during shutdown: its followers end at once
        return chan

    def _unsubscribe(self, table: dict[str, Channel], key: str, what: str) -> int:
        chan = table.get(key)
        if chan is None:
            return 0
        self._followers[what] -= 1
        chan.refs -= 1
        if chan.refs <= 0:
            if not chan.held and key not in self._retained:
                del table[key]
            return 0
        return chan.refs
