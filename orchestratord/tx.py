"""The write transaction services see: ``Tx``.

Statements run on it (``await stmt.rows(tx, params)``, ``db/prepared.py``), the ORM works on
its ``session``, events are appended to it, and what must happen once it has committed, or
if it does not, is registered on it. Underneath it is a session's transaction, or one begun
on the driver (SQLite in a file, PostgreSQL on asyncpg) that a session joins only when code
first asks for ``session``: a transaction made of prepared statements alone opens none.
How it runs is ``orchestratord/db``'s business, not the services'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from orchestratord.db.prepared import _Target, dialect_of

if TYPE_CHECKING:
    from orchestratord.db.engine import _WriteTx
    from orchestratord.eventlog import LogEvent


class Tx:
    """A write transaction (``Orchestrator.tx``, ``Database.driver_write``)."""

    __slots__ = ("_on", "_sqlite", "_write", "callbacks", "events", "undo")

    def __init__(self, on: AsyncSession | _WriteTx) -> None:
        self._on = on
        # begun on the driver (``target``, asked at every statement, reads it directly)
        self._write = None if isinstance(on, AsyncSession) else on
        self.events: list[LogEvent] = []
        self.callbacks: list[Callable[[], None]] = []
        self.undo: list[Callable[[], None]] = []
        self._sqlite: bool | None = None

    @property
    def session(self) -> AsyncSession:
        """The ORM's session in this transaction (made, and joined to it, when first asked
        for)."""
        on = self._on
        return on if isinstance(on, AsyncSession) else on.session

    @property
    def joined(self) -> AsyncSession | None:
        """The session in this transaction if one was made (the ORM may hold what a statement
        changes), else ``None``; asking does not make one."""
        on = self._on
        return on if isinstance(on, AsyncSession) else on.joined

    @property
    def target(self) -> _Target:
        """Where prepared statements run (``db/prepared.py``): the session once there is one
        (it flushes what it holds first), else the driver's transaction."""
        write = self._write
        if write is None:
            return self._on  # type: ignore[return-value]  # (a session's transaction)
        joined = write.joined
        return write.driver if joined is None else joined

    @property
    def sqlite(self) -> bool:
        sqlite = self._sqlite
        if sqlite is None:  # asked several times per submission; the dialect never changes
            sqlite = self._sqlite = dialect_of(self.target).name == "sqlite"
        return sqlite

    @property
    def postgresql(self) -> bool:
        return not self.sqlite  # the two databases served

    async def append_events(self, events: list[LogEvent]) -> None:
        """Write events now; they are published to followers after commit."""
        if not events:
            return
        # (the event log imports the database, which makes transactions of this type)
        from orchestratord.eventlog import insert_events

        self.events.extend(await insert_events(self, events))

    def after_commit(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def on_rollback(self, callback: Callable[[], None]) -> None:
        """Undo what was taken in memory for this transaction if it does not commit."""
        self.undo.append(callback)

    def rolled_back(self) -> None:
        for callback in self.undo:
            callback()
