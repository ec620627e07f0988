"""Open streams per API key in this process (``limits.max_followers_per_key``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

from orchestrator_core.errors import LimitExceeded


class KeyStreams:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()

    def open(self, key_id: str) -> None:
        """Count a stream of the key, or refuse it (before it subscribes)."""
        if self._open[key_id] >= self.limit:
            raise LimitExceeded(
                f"key {key_id} has {self.limit} open streams here",
                limit="limits.max_followers_per_key",
                value=self.limit,
                retry_after_ms=1000,
            )
        self._open[key_id] += 1

    def close(self, key_id: str) -> None:
        self._open[key_id] -= 1
        if self._open[key_id] <= 0:
            del self._open[key_id]

    def count(self, key_id: str) -> int:
        return self._open[key_id]

    def held(self, key_id: str, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``body``, counted as one open stream of the key (opened already) until it ends or
        is closed, even if it never started (the client left before the first byte)."""
        return _Held(self, key_id, body)


class _Held:
    def __init__(self, streams: KeyStreams, key_id: str, body: AsyncIterator[bytes]) -> None:
        self.streams, self.key_id, self.body = streams, key_id, body
        self.released = False

    def __aiter__(self) -> _Held:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self.body)
        except BaseException:  # the end, an error or a cancel: the stream is over
            self.release()
            raise

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.streams.close(self.key_id)

    async def aclose(self) -> None:
        self.release()
        aclose = getattr(self.body, "aclose", None)
        if aclose is not None:
            await aclose()
