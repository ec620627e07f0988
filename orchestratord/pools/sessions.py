"""Engine sessions owned by runs (session-bound engines: Kakeya, Salience).

One session per (run, pool), on the replica that opened it: the dispatcher keeps the run's
later steps on that replica while the session lives, and the run's steps use it one at a time
(the engines take one request per session). The session is closed on the engine when the
run ends. Sessions live in this process; a step of the run claimed by another process opens
its own (the adapter recreates the conversation from the prompt).

A run forked from another starts from its parent's session where the engine forks sessions
(Salience ``ForkSession``): its first step runs on the parent's replica, and the engine copies
the prefix the two conversations share instead of being sent it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from worker_adapters.session_handle import EngineSession

log = logging.getLogger(__name__)


@dataclass
class _Held:
    replica_id: str
    adapter: Any  # a session-bound WorkerAdapter (open_session, close_session)
    session: EngineSession
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RunSessions:
    def __init__(self) -> None:
        self._held: dict[tuple[str, str], _Held] = {}

    def replica_of(self, run_id: str, pool_id: str) -> str | None:
        held = self._held.get((run_id, pool_id))
        return None if held is None else held.replica_id

    def sessions_of(self, run_id: str) -> int:
        return sum(1 for run, _ in self._held if run == run_id)

    def placement_of(self, run_id: str, pool_id: str, parent_run_id: str | None) -> str | None:
        """The replica a run's next step belongs on: its session's, else (a fork that has
        none yet) its parent's."""
        mine = self.replica_of(run_id, pool_id)
        if mine is None and parent_run_id is not None:
            return self.replica_of(parent_run_id, pool_id)
        return mine

    @contextlib.asynccontextmanager
    async def use(
        self,
        run_id: str,
        pool_id: str,
        replica_id: str,
        adapter: Any,
        *,
        parent_run_id: str | None = None,
    ) -> AsyncIterator[EngineSession]:
        """The run's session on this pool (opened on first use, forked from its parent's
        when it has one here), held for one request."""
        key = (run_id, pool_id)
        held = self._held.get(key)
        parent = None
        if held is None or held.replica_id != replica_id:
            if held is not None:  # the run moved (its replica was gone): start over there
                self._spawn_close(held)
            held = self._held[key] = _Held(replica_id, adapter, adapter.open_session())
            parent = self._held.get((parent_run_id, pool_id)) if parent_run_id else None
            if parent is not None and parent.replica_id == replica_id:
                held.session.fork_of = parent.session
            else:
                parent = None
        async with held.lock:
            if parent is None:
                yield held.session
                return
            async with parent.lock:  # the fork reads the parent's history: not mid-turn
                yield held.session

    async def end_run(self, run_id: str) -> None:
        """Close the run's sessions on their engines."""
        for key in [k for k in self._held if k[0] == run_id]:
            held = self._held.pop(key)
            async with held.lock:
                await _close(held)

    def _spawn_close(self, held: _Held) -> None:
        task = asyncio.get_running_loop().create_task(_close(held))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


async def _close(held: _Held) -> None:
    try:
        await held.adapter.close_session(held.session)
    except Exception as exc:  # the engine evicts idle sessions itself
        log.warning("could not close engine session %s: %s", held.session.session_id, exc)
