"""Requests and tokens per key per minute, summed over every process through ``key_usage``.

Each process counts locally and, every ``flush_s``, adds its counts to the minute's row
(one upsert per key) and reads back the totals, which include the other processes' counts.
A request is refused when the last known total plus what this process has not yet flushed
reaches the limit. So the processes together overshoot a limit by at most what they admit
within one flush period. Windows are calendar minutes (UTC): a refusal's ``retry_after_ms``
is the time to the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from orchestrator_core.errors import LimitExceeded
from orchestratord.db.engine import Database
from orchestratord.db.models import KeyUsage
from orchestratord.tasks import cancel_and_wait

log = logging.getLogger(__name__)


_TOTALS = sa.select(KeyUsage.key_id, KeyUsage.minute, KeyUsage.requests, KeyUsage.tokens).where(
    KeyUsage.minute >= sa.bindparam("minute")
)


def _minute(t: float) -> int:
    return int(t // 60)


def _retry_after_ms(t: float) -> int:
    return max(1, int((60 - t % 60) * 1000))


class KeyRates:
    def __init__(
        self,
        db: Database,
        *,
        requests_per_minute: int,
        tokens_per_minute: int,
        flush_s: float = 1.0,
    ) -> None:
        self.db = db
        self.rpm = requests_per_minute
        self.tpm = tokens_per_minute
        self.flush_s = flush_s
        self._known: dict[tuple[str, int], list[int]] = {}  # totals as last read
        self._pending: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        self._task: asyncio.Task[None] | None = None
        self._clock = time.time

    @property
    def active(self) -> bool:
        return self.rpm > 0 or self.tpm > 0

    def _used(self, key: tuple[str, int]) -> tuple[int, int]:
        known = self._known.get(key, (0, 0))
        pending = self._pending.get(key, (0, 0))
        return known[0] + pending[0], known[1] + pending[1]

    def request(self, key_id: str) -> None:
        """Count one request, or refuse it when the key's minute is full."""
        if self.rpm <= 0:
            return
        self._start()
        t = self._clock()
        key = (key_id, _minute(t))
        requests, _ = self._used(key)
        if requests >= self.rpm:
            raise LimitExceeded(
                f"key {key_id} made {self.rpm} requests this minute",
                limit="limits.requests_per_minute",
                value=self.rpm,
                retry_after_ms=_retry_after_ms(t),
            )
        self._pending[key][0] += 1

    def check_tokens(self, key_id: str) -> None:
        """Refuse a submission when the key's tokens this minute reached the limit."""
        if self.tpm <= 0:
            return
        self._start()
        t = self._clock()
        _, tokens = self._used((key_id, _minute(t)))
        if tokens >= self.tpm:
            raise LimitExceeded(
                f"key {key_id} submitted {self.tpm} tokens this minute",
                limit="limits.tokens_per_minute",
                value=self.tpm,
                retry_after_ms=_retry_after_ms(t),
            )

    def add_tokens(self, key_id: str, tokens: int) -> None:
        if self.tpm > 0 and tokens > 0:
            self._pending[(key_id, _minute(self._clock()))][1] += tokens

    async def flush(self) -> None:
        """Add this process's counts to the shared rows; read back every key's totals."""
        pending, self._pending = self._pending, defaultdict(lambda: [0, 0])
        current = _minute(self._clock())
        for key in [k for k in self._known if k[1] < current]:
            del self._known[key]
        try:
            if pending:
                await self._add(pending, current)
        except Exception:
            log.exception("key usage not flushed; counted again next time")
            for key, (requests, tokens) in pending.items():
                self._pending[key][0] += requests
                self._pending[key][1] += tokens
            return
        try:
            async with self.db.read() as session:
                rows = await session.execute(_TOTALS, {"minute": current})
                for key_id, minute, requests, tokens in rows:
                    self._known[(key_id, minute)] = [requests, tokens]
        except Exception:  # added: until the next read, count what this process added
            log.exception("key usage totals not read; read again next time")
            for key, (requests, tokens) in pending.items():
                known = self._known.setdefault(key, [0, 0])
                known[0] += requests
                known[1] += tokens

    async def _add(self, pending: dict[tuple[str, int], list[int]], current: int) -> None:
        """One upsert per key and minute: the counts add up whatever other processes wrote."""
        insert = (sqlite if self.db.is_sqlite else postgresql).insert
        async with self.db.write() as session:
            for (key_id, minute), (requests, tokens) in pending.items():
                stmt = insert(KeyUsage).values(
                    key_id=key_id, minute=minute, requests=requests, tokens=tokens
                )
                await session.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[KeyUsage.key_id, KeyUsage.minute],
                        set_={
                            "requests": KeyUsage.requests + stmt.excluded.requests,
                            "tokens": KeyUsage.tokens + stmt.excluded.tokens,
                        },
                    )
                )
            await session.execute(sa.delete(KeyUsage).where(KeyUsage.minute < current - 60))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    def _start(self) -> None:
        """Flushing starts with the first counted request: a server without keys pays nothing."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="key-rates")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
            await self.flush()
