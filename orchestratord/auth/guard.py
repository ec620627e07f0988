"""Who a request acts for: a key's text checked against its stored digest, with a short cache.

A verified key is trusted for ``auth.cache_s`` seconds (so a revocation takes effect within
that time in every process); a refused one is remembered as long, so a bad key retried in a
loop costs one scrypt per period. Verifications run in a thread, two at a time at most, so a
flood of wrong secrets for a real key id cannot stall the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from orchestrator_core import clock, keys
from orchestrator_core.errors import Unauthenticated
from orchestrator_core.keys import Principal, Scope
from orchestratord.auth import store
from orchestratord.db.engine import Database

_T = TypeVar("_T")
_MAX_CACHED = 10_000
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
    ) -> None:
        self.db = db
        self.open_paths = open_paths
        self.required = required  # serve --auth: on even before a key exists
        self.cache_s = cache_s
        self._cache: dict[str, _Entry] = {}
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

    def forget(self) -> None:
        """Drop what is cached (after keys change in this process)."""
        self._cache.clear()
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
                return None
            salt, digest, name, scope = row.salt, row.digest, row.name, row.scope
        async with self._verifying:
            ok = await asyncio.to_thread(keys.verify, secret, salt, digest)
        return Principal(key_id, name, Scope.parse(scope)) if ok else None
