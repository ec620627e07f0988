"""Who a request acts for: a key's text checked against its stored digest, with a short cache.

A verified key is trusted for ``auth.cache_s`` seconds (so a revocation takes effect within
that time in every process); a refused one is remembered as long. A check is one database
read and one HMAC (``orchestrator_core.keys``), the same work for a key id that has no row
(its rejection time says nothing of which ids exist). A digest of the scheme before (scrypt)
is checked in a thread, two at a time at most, and rewritten on its first success.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from orchestrator_core import clock, keys
from orchestrator_core.errors import LimitExceeded, Unauthenticated
from orchestrator_core.keys import Principal, Scope
from orchestratord.auth import store
from orchestratord.auth.failures import FailedKeys
from orchestratord.db.engine import Database

_T = TypeVar("_T")
_MAX_CACHED = 10_000
# how long a key verified once is let past the per-address limit of refused keys
GOOD_FOR_S = 600.0
_ANY = "no valid API key: send Authorization: Bearer <key>"
_MALFORMED = "API key not valid (unknown, revoked or malformed)"


@dataclass(slots=True)
class _Entry:
    principal: Principal | None
    until: float


class KeyGuard:
    def __init__(
        self,
        db: Database,
        *,
        required: bool,
        cache_s: float,
        open_paths: frozenset[str] = frozenset({"/healthz"}),
        pepper: str = "",
        max_failures_per_minute: int = 0,
        limited_wait_s: float = 0.0,
    ) -> None:
        self.db = db
        self.pepper = pepper
        self.failures = FailedKeys(max_failures_per_minute)
        self.limited_wait_s = limited_wait_s
        self.wait = asyncio.sleep  # (tests see the waits)
        self.open_paths = open_paths
        self.required = required  # serve --auth: on even before a key exists
        self.cache_s = cache_s
        self._cache: dict[str, _Entry] = {}
        self._good: dict[str, float] = {}  # keys verified lately: text -> until
        self._on: bool = required
        self._on_until = float("-inf")
        self._verifying = asyncio.Semaphore(2)
        self._looking: dict[str, asyncio.Future[Any]] = {}  # by key text ("": any key at all)

    @property
    def on(self) -> bool:
        """Whether the last check found auth on."""
        return self._on

    async def enabled(self) -> bool:
        """On with ``--auth``, or once any key exists (checked every ``cache_s``)."""
        if self._on:
            return True
        t = clock.monotonic()
        if t >= self._on_until:
            self._on = await self._once("", self._any_key)
            self._on_until = t + self.cache_s
        return self._on

    async def _any_key(self) -> bool:
        async with self.db.read() as session:
            return await store.any_key(session)

    async def _once(self, key: str, look: Callable[[], Awaitable[_T]]) -> _T:
        """``look()``, once for every caller asking while it runs: a burst of requests that
        finds the cached answer expired makes one read, not one each."""
        running = self._looking.get(key)
        if running is None:
            running = self._looking[key] = asyncio.ensure_future(look())
            running.add_done_callback(lambda _done: self._looking.pop(key, None))
        # a caller that goes away does not cancel the others' answer
        return cast(_T, await asyncio.shield(running))

    async def principal_from(self, text: str | None, address: str) -> Principal:
        """``principal(text)`` for a request from ``address``: an address, or a key id, past
        its refused keys of the minute is answered 429 unless its key was verified here before."""
        parsed = keys.parse(text) if text is not None else None
        key_id = parsed[0] if parsed is not None else None
        if text is not None and not self.verified(text):
            try:
                self.failures.check(address, key_id)
            except LimitExceeded as exc:
                # held before its 429: each connection of a flood sends one request a wait,
                # and the held ones cost a sleeping task, not the loop's time; a spread
                # wait, so the held requests do not all come back at once
                left_s = (exc.retry_after_ms or 0) / 1000
                spread = random.uniform(0.5, 1.0)
                await self.wait(min(self.limited_wait_s * spread, left_s))
                raise
        try:
            return await self.principal(text)
        except Unauthenticated:
            if text is not None:
                self.failures.note(address, key_id)
            raise

    def verified(self, text: str) -> bool:
        """Whether ``text`` is a key this process verified in the last ``GOOD_FOR_S``: one
        the per-address limit lets through (it is still checked, revocation included)."""
        until = self._good.get(text)
        return until is not None and clock.monotonic() < until

    def forget(self) -> None:
        """Drop what is cached (after keys change in this process)."""
        self._cache.clear()
        self._good.clear()
        self._on_until = float("-inf")

    async def principal(self, text: str | None) -> Principal:
        """The key's principal, or ``Unauthenticated``."""
        if text is None:
            raise Unauthenticated(_ANY)
        if keys.parse(text) is None:  # not a key's shape: refused without a cache entry
            raise Unauthenticated(_MALFORMED)
        t = clock.monotonic()
        entry = self._cache.get(text)
        if entry is None or t >= entry.until:
            entry = _Entry(await self._once(text, lambda: self._verify(text)), t + self.cache_s)
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            self._cache[text] = entry
            if entry.principal is not None:
                if len(self._good) >= _MAX_CACHED:
                    self._good.clear()
                self._good[text] = t + max(GOOD_FOR_S, self.cache_s)
        if entry.principal is None:
            raise Unauthenticated(_MALFORMED)
        return entry.principal

    async def _verify(self, text: str) -> Principal | None:
        parsed = keys.parse(text)
        if parsed is None:
            return None
        key_id, secret = parsed
        async with self.db.read() as session:
            row = await store.find(session, key_id=key_id)
            if row is None or row.revoked_at is not None:
                keys.verify_absent(secret, self.pepper)  # the work a real id costs
                return None
            salt, digest, name, scope = row.salt, row.digest, row.name, row.scope
        if keys.is_current(digest):
            ok = keys.verify(secret, salt, digest, self.pepper)
        else:  # a key stored before HMAC: checked once more the old way, then rewritten
            async with self._verifying:
                ok = await asyncio.to_thread(keys.verify, secret, salt, digest)
            if ok:
                async with self.db.write() as session:
                    current = keys.digest(secret, salt, self.pepper)
                    await store.rehash(session, key_id=key_id, digest=current)
        return Principal(key_id, name, Scope.parse(scope)) if ok else None
