"""Wake-ups across processes (PostgreSQL): other processes' commits reach our followers.

Every transaction that appends events NOTIFYs ``eventlog.WAKE_CHANNEL`` with the keys it
touched (``eventlog.insert_events``), delivered when it commits. One LISTEN connection per
process turns those into pokes of the hub's channels; a poked follower reads the log at its
cursor. Nothing is carried but keys, so a lost or duplicated wake-up costs one read, never an
event. While the connection is down, followers fall back to polling (``live`` is False), and
every channel is poked when it comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sqlalchemy.engine import make_url

from orchestratord.eventlog import WAKE_CHANNEL
from orchestratord.streams.hub import Hub
from orchestratord.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class LogWakeups:
    def __init__(self, url: str, hub: Hub, origin: str, *, retry_s: float = 1.0) -> None:
        self._dsn = asyncpg_dsn(url)
        self._hub = hub
        self._origin = origin
        self._retry_s = retry_s
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self.received = 0

    @property
    def live(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def start(self) -> None:
        await self._connect()  # the first connection is made before the service serves
        self._task = asyncio.create_task(self._keep(), name="log-wakeups")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)

    async def _connect(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self._dsn, timeout=10)
        conn.add_termination_listener(lambda _conn: self._lost.set())
        await conn.add_listener(WAKE_CHANNEL, self._on_notify)
        self._conn = conn
        self._lost.clear()

    async def _keep(self) -> None:
        while True:
            await self._lost.wait()
            log.warning("wake-up connection lost; followers poll until it is back")
            self._conn = None
            while self._conn is None:
                try:
                    await self._connect()
                except Exception as exc:  # the database may be restarting
                    log.warning("wake-up connection: %s; retrying", exc)
                    await asyncio.sleep(self._retry_s)
            self._hub.poke_all()  # what was committed while it was down

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        origin, _, keys = str(payload).partition(" ")
        if origin == self._origin:
            return  # our own commits reach the hub directly
        self.received += 1
        if keys == "*":
            self._hub.poke_all()
        else:
            self._hub.poke(keys.split())
