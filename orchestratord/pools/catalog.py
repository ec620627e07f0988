"""The pools this process serves, kept in step with the ``pools`` table (``pools/store.py``).

The one writer of pool rows: the pools file's set (at start and on SIGHUP), ``POST`` and
``DELETE /v1/pools``, and provisioning go through it. Each write is applied here at once;
the other processes apply it at their next health refresh (``sync``).

A pool removed or rebuilt lets go of its adapters once the steps this process runs on them
have ended (a pool in use is not deleted, but the file may change a pool under load).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from orchestrator_core.errors import Conflict, NotFound
from orchestrator_core.secrets import Scrubber
from orchestratord.db.engine import Database
from orchestratord.pools import store
from orchestratord.pools.config import PoolSpec
from orchestratord.pools.registry import Changes, Pool, PoolRegistry
from orchestratord.pools.store import PoolRecord, Source
from orchestratord.scrubbing import secrets_of

log = logging.getLogger(__name__)

RETIRE_POLL_S = 0.2


class PoolCatalog:
    def __init__(
        self,
        db: Database,
        registry: PoolRegistry,
        scrubber: Scrubber,
        *,
        declared: list[PoolSpec] | None,
        retire_s: float = 60.0,
    ) -> None:
        self.db = db
        self.registry = registry
        self.scrubber = scrubber
        self.declared = declared  # the pools file's set; None: the pools were given in code
        self.retire_s = retire_s
        self.records: dict[str, PoolRecord] = {}
        self.on_change: list[Callable[[Changes], None]] = []
        self._retiring: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Write the pools file's set, then serve every pool the table holds."""
        if self.declared is not None:
            await self.declare(self.declared)
        else:
            await self.sync()

    async def declare(self, specs: list[PoolSpec]) -> list[str]:
        """The pools file's set replaces what it declared before (``store.declare``); the
        ids of pools it dropped but that steps still use (kept for now)."""
        async with self.db.write() as session:
            kept = await store.declare(session, specs)
        for pool_id in kept:
            log.warning(
                "pool %s is no longer in the pools file but steps run or wait on it: kept; "
                "it goes at the next reload once they are done",
                pool_id,
            )
        self.declared = specs
        await self.sync()
        return kept

    async def sync(self) -> Changes:
        """Serve the pools the table holds now: build the new and changed, retire the gone."""
        async with self.db.read() as session:
            records = await store.read_all(session)
        fixed = self.registry.fixed()
        # pools given in code stand for a pools file: the file's rows are not this process's
        by_file = self.declared is not None
        self.records = {
            p: r for p, r in records.items() if p not in fixed and (by_file or r.source != "file")
        }
        changes = self.registry.apply({p: r.spec for p, r in self.records.items()})
        if changes:
            for pool in changes.added:
                self.scrubber.learn(secrets_of(pool))
            if changes.added:
                await self.registry.refresh(changes.added)
            for pool in changes.removed:
                self._retire(pool)
            for callback in self.on_change:
                callback(changes)
        return changes

    async def create(
        self, spec: PoolSpec, source: Source, *, provision: dict[str, object] | None = None
    ) -> tuple[Pool, bool]:
        """Add a pool; the same pool again is no change (a retried request). Returns the
        pool and whether it was created."""
        async with self.db.write() as session:
            record = await store.read(session, spec.pool_id)
            if record is None:
                self._refuse_fixed(spec.pool_id)
                await store.put(session, spec, source, provision=provision)
            elif not record.same_as(spec, source):
                raise Conflict(
                    f"pool {spec.pool_id!r} exists ({record.source}) with another definition: "
                    "delete it first, or choose another pool_id",
                    details={"field": "pool_id", "pool_id": spec.pool_id, "source": record.source},
                )
        await self.sync()
        return self.registry.require(spec.pool_id), record is None

    def _refuse_fixed(self, pool_id: str) -> None:
        if pool_id in self.registry.fixed():
            raise Conflict(
                f"pool {pool_id!r} is built into this process and cannot be redefined",
                details={"field": "pool_id", "pool_id": pool_id},
            )

    async def delete(
        self, pool_id: str, *, sources: tuple[str, ...] = ("api", "provisioned")
    ) -> PoolRecord:
        """Remove a pool no step runs or waits on. A pool the file declares is removed from
        the file (and the file reloaded), not here."""
        async with self.db.write() as session:
            record = await store.read(session, pool_id)
            if record is None:
                raise NotFound("pool", pool_id)
            if record.source not in sources:
                raise Conflict(
                    f"pool {pool_id!r} is declared by the pools file: remove it there and "
                    "reload (SIGHUP)",
                    details={"pool_id": pool_id, "source": record.source},
                )
            busy = await store.in_use(session, pool_id)
            if busy:
                raise Conflict(
                    f"pool {pool_id!r} is in use: {busy.running} steps running and "
                    f"{busy.queued} queued on it (drain its replicas, and wait)",
                    details={"pool_id": pool_id, **busy.as_dict()},
                    retriable=True,
                )
            await store.remove(session, pool_id)
        await self.sync()
        return record

    def _retire(self, pool: Pool) -> None:
        """Close a pool's adapters once the steps this process runs on it have ended."""
        task = asyncio.create_task(self._close_when_idle(pool))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_when_idle(self, pool: Pool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retire_s
        while any(r.busy for r in pool.replicas) and loop.time() < deadline:
            await asyncio.sleep(RETIRE_POLL_S)
        await self.registry.aclose([pool])

    async def aclose(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
