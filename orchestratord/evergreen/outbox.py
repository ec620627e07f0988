"""What a session has for its client: at most ``limit`` messages wait to be sent.

The session's producers ``put`` and wait while it is full; its steps wait on :meth:`room`
between tokens (``steps/pacing.py``), so a client that does not read holds its session's
generation instead of growing a queue. ``end`` says nothing more comes: ``get`` returns
:data:`DONE` once what came before is taken (``drop=True``: at once, the rest dropped).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class _Done:
    """The end of the outgoing messages."""


DONE = _Done()


class Outbox:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[Any] = deque()
        self._ended = False
        self._ready = asyncio.Event()  # an item or the end is there
        self._room = asyncio.Event()  # fewer than ``limit`` items wait (or it ended)
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, message: Any) -> None:
        """Queue ``message``, once there is room; dropped when the outbox has ended."""
        while len(self._items) >= self.limit and not self._ended:
            self._room.clear()
            await self._room.wait()
        if self._ended:
            return
        self._items.append(message)
        if len(self._items) >= self.limit:
            self._room.clear()
        self._ready.set()

    async def room(self) -> None:
        """Return once a message more would fit (or nothing more will be sent)."""
        if not self._room.is_set():
            await self._room.wait()

    def end(self, *, drop: bool = False) -> None:
        """Nothing more is put; ``drop``: what waits is not sent either."""
        self._ended = True
        if drop:
            self._items.clear()
        self._ready.set()
        self._room.set()

    async def get(self) -> Any:
        """The next message, or :data:`DONE` after the end."""
        while not self._items:
            if self._ended:
                return DONE
            self._ready.clear()
            await self._ready.wait()
        message = self._items.popleft()
        if len(self._items) < self.limit:
            self._room.set()
        return message
