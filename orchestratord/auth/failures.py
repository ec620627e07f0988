"""Refused keys per client address and per key id: past ``auth.max_failures_per_minute`` in
the current minute, requests from that address, or naming that key id, whose key this process
has not verified are answered 429 (``Retry-After``: the rest of the minute) without a look at
the database. A key verified before keeps working; other addresses and key ids are not slowed.

The key id counts too because addresses are cheap: a client with many addresses (a /8 of
loopback, a pool of proxies) guessing the secret of one key id is limited by that id."""

from __future__ import annotations

from orchestrator_core import clock
from orchestrator_core.errors import LimitExceeded

_MAX_REMEMBERED = 100_000  # addresses (or key ids) remembered at once (a new minute forgets all)


class _Counts:
    """Refusals of one kind of name (addresses, key ids) in the current minute."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.counts: dict[str, int] = {}

    def over(self, name: str, per_minute: int) -> bool:
        return self.counts.get(name, 0) >= per_minute

    def add(self, name: str) -> None:
        if len(self.counts) >= _MAX_REMEMBERED:
            self.counts.clear()
        self.counts[name] = self.counts.get(name, 0) + 1


class FailedKeys:
    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._minute = -1
        self._addresses = _Counts("this address")
        self._key_ids = _Counts("this key id")

    def _now(self) -> tuple[int, float]:
        t = clock.monotonic()
        minute = int(t // 60)
        if minute != self._minute:
            self._minute = minute
            self._addresses.counts, self._key_ids.counts = {}, {}
        return minute, t

    def _named(self, address: str, key_id: str | None) -> list[tuple[_Counts, str]]:
        named = [(self._addresses, address)]
        if key_id is not None:
            named.append((self._key_ids, key_id))
        return named

    def check(self, address: str, key_id: str | None = None) -> None:
        """``LimitExceeded`` when ``address``, or ``key_id``, used up its refusals this minute."""
        if self.per_minute <= 0:
            return
        minute, t = self._now()
        for counts, name in self._named(address, key_id):
            if counts.over(name, self.per_minute):
                left_ms = max(1, int(((minute + 1) * 60 - t) * 1000))
                raise LimitExceeded(
                    f"too many refused keys from {counts.what}: at most {self.per_minute} a minute",
                    limit="auth.max_failures_per_minute",
                    value=self.per_minute,
                    retry_after_ms=left_ms,
                )

    def note(self, address: str, key_id: str | None = None) -> None:
        """One more refused key from ``address`` (naming ``key_id`` when it had one)."""
        if self.per_minute <= 0:
            return
        self._now()
        for counts, name in self._named(address, key_id):
            counts.add(name)
