"""Provisioned pools: started on request, bounded, stopped when deleted or idle.

A provisioned pool lives with the process that provisioned it (its ``owner``): its engines
are that process's children, stopped when the pool is deleted (through any process: the
owner sees the row gone at its next refresh), when no step used it for its idle TTL, and
when the owner shuts down. A pool whose owner died without shutting down is removed when an
instance of the same name starts again.

``provision.max_engines`` bounds the engines of every provisioned pool, every process
counted. Provisioning never moves a step: it only adds a pool.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from orchestrator_core import clock
from orchestrator_core.errors import Conflict, InvalidParams, OrchestratorError
from orchestratord.pools import store
from orchestratord.pools.catalog import PoolCatalog
from orchestratord.pools.provisioning.processes import EngineProcess
from orchestratord.pools.provisioning.provisioners import Provisioner, provisioners
from orchestratord.pools.provisioning.request import ProvisionRequest
from orchestratord.pools.registry import Changes, Pool
from orchestratord.settings import Settings

log = logging.getLogger(__name__)


class Provisioning:
    def __init__(self, settings: Settings, catalog: PoolCatalog, *, owner: str) -> None:
        self.settings = settings.provision
        self.model_settings = settings
        self.catalog = catalog
        self.owner = owner  # this instance's name
        self.provisioners: dict[str, Provisioner] = provisioners(settings)
        self.owned: dict[str, list[EngineProcess]] = {}  # pool id -> its child processes
        self._starting = 0  # engines being started here now
        self._locks: dict[str, asyncio.Lock] = {}
        self._stopping: set[asyncio.Task[None]] = set()  # engines of pools removed elsewhere
        catalog.on_change.append(self._saw_changes)

    def _provisioner(self, name: str) -> Provisioner:
        found = self.provisioners.get(name)
        if found is None:
            known = ", ".join(sorted(self.provisioners))
            raise InvalidParams(
                f"unknown provisioner {name!r} (known: {known})", field="provisioner"
            )
        return found

    async def provision(self, request: ProvisionRequest) -> tuple[Pool, bool]:
        """Start the request's engines, and once all are healthy serve them as a pool.
        The same request again answers the pool it made (a retry)."""
        provisioner = self._provisioner(request.provisioner)
        asked = request.model_dump(mode="json")
        lock = self._locks.setdefault(request.pool_id, asyncio.Lock())
        async with lock:
            async with self.catalog.db.read() as session:
                existing = await store.read(session, request.pool_id)
            if existing is not None:
                if (
                    existing.source == "provisioned"
                    and (existing.provision or {}).get("request") == asked
                ):
                    await self.catalog.sync()
                    return self.catalog.registry.require(request.pool_id), False
                raise Conflict(
                    f"pool {request.pool_id!r} exists ({existing.source}): delete it first, "
                    "or choose another pool_id",
                    details={"field": "pool_id", "pool_id": request.pool_id},
                )
            started = provisioner.plan(request, self.model_settings)
            await self._within_bound(request.replicas)
            self._starting += request.replicas
            try:
                await asyncio.gather(
                    *(p.start(self.settings.start_timeout_s) for p in started.processes)
                )
            except BaseException:
                await _stop_all(started.processes)
                raise
            finally:
                self._starting -= request.replicas
            provision = {
                "provisioner": provisioner.name,
                "owner": self.owner,
                "idle_ttl_s": (
                    self.settings.idle_ttl_s if request.idle_ttl_s is None else request.idle_ttl_s
                ),
                "engines": [p.as_dict() for p in started.processes],
                "request": asked,
            }
            self.owned[request.pool_id] = started.processes
            try:
                return await self.catalog.create(started.spec, "provisioned", provision=provision)
            except BaseException:
                self.owned.pop(request.pool_id, None)
                await _stop_all(started.processes)
                raise

    async def _within_bound(self, more: int) -> None:
        await self.catalog.sync()  # every process's provisioned pools
        running = sum(
            len(r.spec.replicas) for r in self.catalog.records.values() if r.source == "provisioned"
        )
        bound = self.settings.max_engines
        if running + self._starting + more > bound:
            raise Conflict(
                f"provisioning {more} engines would run {running + self._starting + more}, "
                f"more than provision.max_engines ({bound}): delete a provisioned pool first",
                details={
                    "limit": "provision.max_engines",
                    "value": bound,
                    "running": running + self._starting,
                },
                retriable=True,
            )

    async def delete(self, pool_id: str) -> None:
        """Remove a pool made through the API or provisioned; its engines stop."""
        await self.catalog.delete(pool_id)
        await self._stop(pool_id)

    def _saw_changes(self, changes: Changes) -> None:
        """A pool this process provisioned was removed (through another process): stop its
        engines."""
        for pool in changes.removed:
            if pool.pool_id in self.owned and pool.pool_id not in self.catalog.records:
                task = asyncio.get_running_loop().create_task(self._stop(pool.pool_id))
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

    async def _stop(self, pool_id: str) -> None:
        await _stop_all(self.owned.pop(pool_id, []))

    def _mine(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            (pool_id, record.provision or {})
            for pool_id, record in self.catalog.records.items()
            if record.source == "provisioned"
            and (record.provision or {}).get("owner") == self.owner
        ]

    async def forget_stale(self) -> None:
        """At start: the pools an earlier life of this instance provisioned are gone with
        it (their engines died with it)."""
        for pool_id, _ in self._mine():
            if pool_id not in self.owned:
                await self._remove_quietly(pool_id, "its provisioning process is gone")

    async def reap_idle(self) -> list[str]:
        """Remove the pools provisioned here that no step used for their idle TTL."""
        removed = []
        now = clock.now()
        for pool_id, provision in self._mine():
            ttl = float(provision.get("idle_ttl_s") or 0)
            if ttl <= 0:
                continue
            async with self.catalog.db.read() as session:
                if await store.in_use(session, pool_id):
                    continue
                last = await store.last_active(session, pool_id)
            created = self.catalog.records[pool_id].created_at
            since = created if last is None else max(last, created)
            if (now - since).total_seconds() < ttl:
                continue
            if await self._remove_quietly(pool_id, f"idle for {ttl:g} s"):
                removed.append(pool_id)
        return removed

    async def _remove_quietly(self, pool_id: str, why: str) -> bool:
        try:
            await self.catalog.delete(pool_id, sources=("provisioned",))
        except OrchestratorError as exc:  # used again meanwhile, or already gone
            log.info("provisioned pool %s kept: %s", pool_id, exc.message)
            return False
        log.info("provisioned pool %s removed: %s", pool_id, why)
        await self._stop(pool_id)
        return True

    async def aclose(self) -> None:
        """At shutdown: this process's provisioned pools go, their engines stop."""
        await asyncio.gather(*self._stopping, return_exceptions=True)
        for pool_id in list(self.owned):
            try:
                await self._remove_quietly(pool_id, "its provisioning process stops")
            except Exception:  # the database may be gone already: the engines still stop
                log.exception("provisioned pool %s: row not removed", pool_id)
            await self._stop(pool_id)


async def _stop_all(processes: list[EngineProcess]) -> None:
    await asyncio.gather(*(p.stop() for p in processes), return_exceptions=True)
