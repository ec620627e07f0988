"""One clock and one id source for the whole process, so tests can freeze time."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class Clock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class FrozenClock(Clock):
    """A clock for tests: time moves only when told to."""

    def __init__(self, at: datetime) -> None:
        self._at = at
        self._mono = 0.0

    def now(self) -> datetime:
        return self._at

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        from datetime import timedelta

        self._at += timedelta(seconds=seconds)
        self._mono += seconds


class SkewedClock(Clock):
    """Real time pushed forward on demand (tests): waits that the code measures pass at once,
    while everything else keeps running on the real clock."""

    def __init__(self) -> None:
        self._skew = 0.0

    def now(self) -> datetime:
        from datetime import timedelta

        return datetime.now(UTC) + timedelta(seconds=self._skew)

    def monotonic(self) -> float:
        return time.monotonic() + self._skew

    def advance(self, seconds: float) -> None:
        self._skew += seconds


class IdSource:
    """Monotonic ULIDs: 48-bit milliseconds + 80 random bits, strictly increasing in-process.

    Ids sort by creation time, which gives FIFO order to anything keyed by them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def new(self, prefix: str) -> str:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms <= self._last_ms:
                ms = self._last_ms
                rand = self._last_rand + 1
            else:
                rand = int.from_bytes(os.urandom(10), "big") >> 1  # room to increment
            self._last_ms, self._last_rand = ms, rand
        value = (ms << 80) | (rand & ((1 << 80) - 1))
        chars = []
        for _ in range(26):
            chars.append(_CROCKFORD[value & 31])
            value >>= 5
        return f"{prefix}_{''.join(reversed(chars)).lower()}"


clock: Clock = Clock()
ids = IdSource()


def now() -> datetime:
    return clock.now()


def monotonic() -> float:
    return clock.monotonic()


def new_id(prefix: str) -> str:
    return ids.new(prefix)


def set_clock(new_clock: Clock) -> Clock:
    """Swap the process clock (tests); returns the previous one."""
    global clock
    previous, clock = clock, new_clock
    return previous
