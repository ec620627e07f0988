"""Per-key rates when the shared totals cannot be read back: what this process added still
counts, so a failed read never lets a key past its limit; the next read restores the
totals."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from orchestrator_core.errors import LimitExceeded
from orchestratord.auth.rates import KeyRates
from orchestratord.db.engine import Database


async def test_added_counts_stand_when_the_totals_cannot_be_read(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    rates = KeyRates(db, requests_per_minute=3, tokens_per_minute=0, flush_s=3600)
    rates._clock = lambda: 600.0  # one minute throughout, whatever the machine's speed
    try:
        for _ in range(2):
            rates.request("key_a")
        real_read = db.read

        @asynccontextmanager
        async def broken_read() -> AsyncIterator[Any]:
            raise OSError("the database went away while reading")
            yield  # pragma: no cover

        monkeypatch.setattr(db, "read", broken_read)
        await rates.flush()  # the add commits; the read back fails
        rates.request("key_a")  # the third: 2 added + 0 pending
        with pytest.raises(LimitExceeded):
            rates.request("key_a")  # without the added counts, this would pass
        monkeypatch.setattr(db, "read", real_read)
        await rates.flush()  # the third goes in; the totals are read again
        assert rates._known[("key_a", 10)] == [3, 0]
        with pytest.raises(LimitExceeded):
            rates.request("key_a")
    finally:
        await rates.stop()
