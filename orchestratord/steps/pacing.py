"""Runs whose reader sets their pace: an engine step of such a run waits, between tokens, while
its reader cannot take more.

A front door that streams a run's tokens to one client (an Evergreen session) registers the run
with :meth:`Pacing.follow` for as long as it streams; a step of the run then awaits the
reader's ``room()`` after each token it stored, so a client that does not read holds the
generation where it is, not a growing queue. A run no one registered never waits: stream
followers read the log at their own pace and never hold a step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol


class Reader(Protocol):
    async def room(self) -> None:
        """Return once the reader can take more (at once when it can, or when it is gone)."""
        ...


class Pacing:
    def __init__(self) -> None:
        self._readers: dict[str, Reader] = {}

    @contextlib.contextmanager
    def follow(self, run_id: str, reader: Reader) -> Iterator[None]:
        """While the block runs, ``reader`` sets the pace of ``run_id``'s steps."""
        self._readers[run_id] = reader
        try:
            yield
        finally:
            if self._readers.get(run_id) is reader:
                del self._readers[run_id]

    def reader_of(self, run_id: str) -> Reader | None:
        return self._readers.get(run_id)
