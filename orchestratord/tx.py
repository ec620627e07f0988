"""A write transaction plus what must happen once it has committed, or if it does not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from orchestratord.eventlog import LogEvent, insert_events


@dataclass
class Tx:
    session: AsyncSession
    events: list[LogEvent] = field(default_factory=list)
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)

    async def append_events(self, events: list[LogEvent]) -> None:
        """Write events now; they are published to followers after commit."""
        if not events:
            return
        self.events.extend(await insert_events(self.session, events))

    def after_commit(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def on_rollback(self, callback: Callable[[], None]) -> None:
        """Undo what was taken in memory for this transaction if it does not commit."""
        self.undo.append(callback)

    def rolled_back(self) -> None:
        for callback in self.undo:
            callback()
