"""Refused keys per client address: past ``auth.max_failures_per_minute`` in the current
minute, an address's requests whose key this process has not verified are answered 429
(``Retry-After``: the rest of the minute) without a look at the database. A key verified
before keeps working from that address; other addresses are not slowed."""

from __future__ import annotations

from orchestrator_core import clock
from orchestrator_core.errors import LimitExceeded

_MAX_ADDRESSES = 100_000  # addresses remembered at once (a new minute forgets them all)


class FailedKeys:
    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._minute = -1
        self._counts: dict[str, int] = {}

    def _now(self) -> tuple[int, float]:
        t = clock.monotonic()
        minute = int(t // 60)
        if minute != self._minute:
            self._minute, self._counts = minute, {}
        return minute, t

    def check(self, address: str) -> None:
        """``LimitExceeded`` when ``address`` used up its refusals this minute."""
        if self.per_minute <= 0:
            return
        minute, t = self._now()
        if self._counts.get(address, 0) >= self.per_minute:
            left_ms = max(1, int(((minute + 1) * 60 - t) * 1000))
            raise LimitExceeded(
                f"too many refused keys from this address: at most {self.per_minute} a minute",
                limit="auth.max_failures_per_minute",
                value=self.per_minute,
                retry_after_ms=left_ms,
            )

    def note(self, address: str) -> None:
        """One more refused key from ``address``."""
        if self.per_minute <= 0:
            return
        self._now()
        if len(self._counts) >= _MAX_ADDRESSES:
            self._counts.clear()
        self._counts[address] = self._counts.get(address, 0) + 1
