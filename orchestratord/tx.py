"""A write transaction plus what must happen once it has committed, or if it does not."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncSession

from orchestratord.db.engine import WriteTx
from orchestratord.db.prepared import Target, dialect_of
from orchestratord.eventlog import LogEvent, insert_events


class Tx:
    """A write transaction: a session's, or one begun on the driver (SQLite in a file,
    PostgreSQL on asyncpg) that a session joins when code first asks for ``session``;
    prepared statements run on ``target``, so a transaction made of them alone opens no
    session."""

    def __init__(self, on: AsyncSession | WriteTx) -> None:
        self._on = on
        self.events: list[LogEvent] = []
        self.callbacks: list[Callable[[], None]] = []
        self.undo: list[Callable[[], None]] = []
        self._sqlite: bool | None = None

    @property
    def session(self) -> AsyncSession:
        on = self._on
        return on if isinstance(on, AsyncSession) else on.session

    @property
    def target(self) -> Target:
        """Where prepared statements run: the session once there is one (it flushes what it
        holds first), else the driver's transaction."""
        on = self._on
        return on if isinstance(on, AsyncSession) else on.target

    @property
    def sqlite(self) -> bool:
        sqlite = self._sqlite
        if sqlite is None:  # asked several times per submission; the dialect never changes
            sqlite = self._sqlite = dialect_of(self.target).name == "sqlite"
        return sqlite

    async def append_events(self, events: list[LogEvent]) -> None:
        """Write events now; they are published to followers after commit."""
        if not events:
            return
        self.events.extend(await insert_events(self.target, events))

    def after_commit(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def on_rollback(self, callback: Callable[[], None]) -> None:
        """Undo what was taken in memory for this transaction if it does not commit."""
        self.undo.append(callback)

    def rolled_back(self) -> None:
        for callback in self.undo:
            callback()
