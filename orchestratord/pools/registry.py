"""Pools of engine replicas at run time: adapters, slot accounting, health and load."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contracts.records import BreakerOut, PoolOut, ReplicaOut
from orchestrator_core.breakers import BreakerBoard
from orchestrator_core.errors import NotFound
from orchestrator_core.generation import LlmInput
from orchestrator_core.placement import READY, PoolView, ReplicaView
from orchestrator_core.pricing import Price
from orchestrator_core.replay import EngineIdentity
from orchestratord.engine_requests import generation_request
from orchestratord.pools.capabilities import pool_capabilities, replica_capabilities
from orchestratord.pools.config import GpuSpec, PoolSpec, ReplicaSpec, gpu_ids
from orchestratord.settings import Settings
from worker_adapters import Health, WorkerAdapter
from worker_adapters.registry import EngineDefaults, ReplicaConfig, variant

log = logging.getLogger(__name__)


@dataclass
class Replica:
    replica_id: str
    adapter: WorkerAdapter
    slots: int
    url: str | None = None
    model: str | None = None
    busy: int = 0  # requests this process sends it now
    # slots other processes held when this one last looked (PostgreSQL: ``pools/slots.py``)
    others: int = 0
    health: Health = field(default_factory=lambda: Health(live=True, ready=True))
    capabilities: dict[str, Any] = field(default_factory=dict)
    gpu: GpuSpec | None = None  # declared in the pools file
    gpu_ids: tuple[str, ...] = ()  # one per GPU: <pool_id>/<replica_id>/gpu<N>
    draining: bool = False  # an operator's: no new steps, running ones finish
    # whether its circuit breaker fails calls fast now (the runtime's engine breakers)
    breaker_open: Callable[[], bool] = field(default=lambda: False)
    # its breaker's state and consecutive failures, in this process
    breaker: Callable[[], tuple[str, int]] = field(default=lambda: ("closed", 0))

    @property
    def vram_gib(self) -> int | None:
        """The memory of each of its GPUs, GiB, as declared; None: no GPU declared."""
        return None if self.gpu is None else self.gpu.vram_gib

    @property
    def models(self) -> frozenset[str]:
        """The models it serves: as configured, and every one its engine reports (an
        OpenAI-compatible server lists each model it serves)."""
        reported = self.capabilities.get("models") or ()
        named = {self.model, self.capabilities.get("model"), *reported}
        return frozenset(str(m) for m in named if m)

    @property
    def features(self) -> frozenset[str]:
        """What its engine reported it offers (none before it reported)."""
        return frozenset(str(f) for f in self.capabilities.get("features") or ())

    @property
    def state(self) -> str:
        """Whether it takes steps now: ready | unready | draining | breaker_open."""
        if not self.health.ready:
            return "unready"
        if self.draining:
            return "draining"
        return "breaker_open" if self.breaker_open() else READY

    @property
    def free(self) -> int:
        return max(0, self.slots - self.busy - self.others) if self.state == READY else 0

    @property
    def full_here(self) -> bool:
        """Every slot is held by this process, or it takes no steps: full whatever the
        other processes hold."""
        return self.busy >= self.slots or self.state != READY


@dataclass
class Pool:
    pool_id: str
    engine: str
    tags: dict[str, str]
    replicas: list[Replica]
    capabilities: dict[str, Any] = field(default_factory=dict)
    queued: int = 0
    price: Price | None = None  # its own, from pools.yaml: wins over the price table
    # what it was built from (``pools/store.py``); None: built in code from adapters
    spec: PoolSpec | None = None

    @property
    def ready(self) -> bool:
        return any(r.health.ready for r in self.replicas)

    @property
    def free_slots(self) -> int:
        return sum(r.free for r in self.replicas)

    @property
    def session_bound(self) -> bool:
        """Its engine keeps a run's conversation in a session on one replica."""
        return any(r.adapter.session_bound for r in self.replicas)

    @property
    def models(self) -> frozenset[str]:
        """The models its replicas serve."""
        return frozenset().union(*(r.models for r in self.replicas))

    @property
    def features(self) -> frozenset[str] | None:
        """What every replica that reported its capabilities offers; None before any did."""
        told = [r.features for r in self.replicas if r.capabilities]
        return frozenset.intersection(*told) if told else None

    @property
    def vram_gib(self) -> int | None:
        """The smallest memory of its GPUs, GiB; None unless every replica declares some."""
        sizes = [r.vram_gib for r in self.replicas]
        return None if not sizes or None in sizes else min(s for s in sizes if s is not None)

    @property
    def model_name(self) -> str:
        """The model the pool serves, as its engine reports it (what prices are keyed by)."""
        return str(self.capabilities.get("model") or self.replicas[0].model or self.engine)

    def count_prompt_tokens(self, llm: LlmInput) -> int:
        """Prompt tokens by the engine's tokenizer; else UTF-8 bytes, an upper bound."""
        request = generation_request(llm, request_id="count", seed=0, max_tokens=1)
        for replica in self.replicas:
            n = replica.adapter.count_tokens(request)
            if n is not None:
                return n
        return len(request.rendered_prompt().encode())

    def identity_of(self, replica: Replica) -> dict[str, Any]:
        """The capabilities ``replica`` reported, else the pool's."""
        return replica.capabilities or self.capabilities

    def acquire(self, replica_id: str | None = None) -> Replica | None:
        """Take a slot on the replica with most free slots (ties: smallest replica id), or
        on ``replica_id`` only when the step is pinned to it."""
        candidates = [r for r in self.replicas if r.free > 0 and replica_id in (None, r.replica_id)]
        if not candidates:
            return None
        replica = min(candidates, key=lambda r: (-r.free, r.replica_id))
        replica.busy += 1
        return replica

    def release(self, replica: Replica) -> None:
        replica.busy = max(0, replica.busy - 1)

    def saw_held(self, held: dict[str, int]) -> None:
        """The slots held per replica, every process counted (this one's among them)."""
        for replica in self.replicas:
            replica.others = max(0, held.get(replica.replica_id, 0) - replica.busy)

    def saw_draining(self, drained: set[str]) -> None:
        """The replicas an operator drained, as the database says."""
        for replica in self.replicas:
            replica.draining = replica.replica_id in drained

    @property
    def full_here(self) -> bool:
        return all(r.full_here for r in self.replicas)

    def replica(self, replica_id: str) -> Replica | None:
        return next((r for r in self.replicas if r.replica_id == replica_id), None)

    @property
    def health_label(self) -> str:
        if self.ready:
            return "ready"
        if any(r.health.live for r in self.replicas):
            return "live"
        return "down"

    def view(self, queued: int, held: dict[tuple[str, str], int] | None = None) -> PoolOut:
        """What ``GET /v1/pools`` shows: ``held`` counts every process's slots (PostgreSQL),
        else this process's are the whole."""
        self.queued = queued
        if held is not None:
            self.saw_held({r: n for (p, r), n in held.items() if p == self.pool_id})
        return PoolOut(
            pool_id=self.pool_id,
            engine=self.engine,
            tags=self.tags,
            capabilities=pool_capabilities(self),
            price=None if self.price is None else self.price.rates(),
            health=self.health_label,
            load=self.load(),
            replicas=[
                ReplicaOut(
                    replica_id=r.replica_id,
                    url=r.url,
                    model=r.model,
                    slots=r.slots,
                    busy=r.busy + r.others,
                    free=r.free,
                    state=r.state,
                    breaker=BreakerOut.model_validate(
                        dict(zip(("state", "failures"), r.breaker(), strict=True))
                    ),
                    capabilities=replica_capabilities(r),
                    health={
                        "live": r.health.live,
                        "ready": r.health.ready,
                        "detail": r.health.detail,
                    },
                )
                for r in self.replicas
            ],
        )

    def placement_view(self) -> PoolView:
        """What placement reads of the pool (orchestrator_core.placement)."""
        replicas = tuple(
            ReplicaView(replica_id=r.replica_id, free_slots=r.free, state=r.state)
            for r in self.replicas
        )
        return PoolView(
            pool_id=self.pool_id,
            tags=self.tags,
            ready=any(r.state == READY for r in replicas),
            free_slots=sum(r.free_slots for r in replicas),
            models=self.models,
            features=self.features,
            replicas=replicas,
            vram_gib=self.vram_gib,
        )

    def breaker_target(self, replica_id: str) -> str:
        """The name of one of its replicas' circuit breaker."""
        return f"replica:{self.pool_id}/{replica_id}"

    def load(self) -> dict[str, int]:
        busy = sum(r.busy + r.others for r in self.replicas)
        total = sum(r.slots for r in self.replicas)
        return {"slots_busy": busy, "slots_free": max(0, total - busy), "queue_depth": self.queued}


@dataclass(frozen=True)
class Changes:
    """What ``PoolRegistry.apply`` did: pools it built (to start) and let go (to close)."""

    added: list[Pool]
    removed: list[Pool]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


class PoolRegistry:
    def __init__(self, pools: list[Pool], settings: Settings | None = None) -> None:
        self.pools = {p.pool_id: p for p in pools}
        self.settings = settings  # what new pools' adapters are built with
        # the pools that are data (``pools/catalog.py``): built, rebuilt and let go by
        # ``apply``; the others were given in code and stay as they are
        self.managed: set[str] = set()
        self._board: BreakerBoard | None = None

    def apply(self, specs: dict[str, PoolSpec]) -> Changes:
        """Make the pools built from data the ones in ``specs``: build those new or changed,
        let go of those gone. Pools given in code (not ``managed``) stay as they are."""
        added, removed = [], []
        for pool_id, spec in specs.items():
            current = self.pools.get(pool_id)
            if current is not None and pool_id not in self.managed:
                continue  # given in code
            self.managed.add(pool_id)
            if current is not None and current.spec == spec:
                continue
            pool = build_pool(spec, self.settings or Settings())
            if current is not None:
                removed.append(current)
            self.pools[pool_id] = pool
            self._watch(pool)
            added.append(pool)
        for pool_id in sorted(self.managed - set(specs)):
            self.managed.discard(pool_id)
            if pool_id in self.pools:
                removed.append(self.pools.pop(pool_id))
        return Changes(added=added, removed=removed)

    def fixed(self) -> set[str]:
        """The pools given in code, not data."""
        return set(self.pools) - self.managed

    def get(self, pool_id: str) -> Pool | None:
        return self.pools.get(pool_id)

    def require(self, pool_id: str) -> Pool:
        pool = self.pools.get(pool_id)
        if pool is None:
            raise NotFound("pool", pool_id)
        return pool

    def saw_draining(self, drained: set[tuple[str, str]]) -> None:
        """The (pool, replica) pairs an operator drained, as the database says."""
        for pool in self.pools.values():
            pool.saw_draining({r for p, r in drained if p == pool.pool_id})

    def watch_breakers(self, board: BreakerBoard) -> None:
        """Replicas whose breaker fails calls fast take no steps (``Replica.state``)."""
        self._board = board
        for pool in self.pools.values():
            self._watch(pool)

    def _watch(self, pool: Pool) -> None:
        if self._board is None:
            return
        for replica in pool.replicas:
            target = pool.breaker_target(replica.replica_id)
            replica.breaker_open = functools.partial(self._board.is_open, target)
            replica.breaker = functools.partial(self._board.state_of, target)

    def views(self) -> list[PoolView]:
        return [p.placement_view() for p in self.pools.values()]

    async def refresh(self, pools: list[Pool] | None = None) -> None:
        """Ask every replica (of ``pools``: default all) for health and capabilities."""
        for pool in list(self.pools.values()) if pools is None else pools:
            for replica in pool.replicas:
                try:
                    await replica.adapter.start()
                    replica.health = await replica.adapter.health()
                except Exception as exc:
                    replica.health = Health(live=False, ready=False, detail=str(exc))
            for replica in pool.replicas:  # each replica reports the build it runs
                try:
                    replica.capabilities = (await replica.adapter.capabilities()).as_dict()
                except Exception as exc:
                    log.warning(
                        "replica %s/%s: capabilities unavailable: %s",
                        pool.pool_id,
                        replica.replica_id,
                        exc,
                    )
            if pool.replicas and pool.replicas[0].capabilities:
                pool.capabilities = pool.replicas[0].capabilities

    def identities(self) -> dict[tuple[str, str], EngineIdentity]:
        """What each replica runs, as provenance names it (for strict_replay's checks)."""
        out = {}
        for pool in self.pools.values():
            for replica in pool.replicas:
                caps = pool.identity_of(replica)
                out[(pool.pool_id, replica.replica_id)] = EngineIdentity(
                    engine=caps.get("engine", pool.engine),
                    engine_version=caps.get("engine_version"),
                    model_hash=caps.get("model_hash"),
                )
        return out

    async def aclose(self, pools: list[Pool] | None = None) -> None:
        """Close the adapters of ``pools`` (default: all)."""
        await asyncio.gather(
            *(
                r.adapter.aclose()
                for p in (self.pools.values() if pools is None else pools)
                for r in p.replicas
            ),
            return_exceptions=True,
        )


def engine_defaults(settings: Settings) -> EngineDefaults:
    """What the settings give the engines' factories."""
    return EngineDefaults(
        sim_tokens_per_s=settings.sim.tokens_per_s,
        sim_eos_probability=settings.sim.eos_probability,
        llama_model_path=settings.llama_model_path,
        max_token_bytes=settings.engine_limits.max_token_bytes,
        max_error_bytes=settings.engine_limits.max_error_bytes,
    )


def build_adapter(engine: str, replica: ReplicaSpec, settings: Settings) -> WorkerAdapter:
    """The adapter of one replica, by its engine's registered variant."""
    found = variant(engine)
    config = ReplicaConfig(
        replica_id=replica.replica_id,
        url=replica.url,
        address=found.address(replica.url),
        model=replica.model,
        slots=replica.slots,
    )
    return found.adapter_for(config, replica.options, engine_defaults(settings))


def build_pool(spec: PoolSpec, settings: Settings) -> Pool:
    replicas = [
        Replica(
            replica_id=r.replica_id,
            adapter=build_adapter(spec.engine, r, settings),
            slots=r.slots,
            url=r.url,
            model=r.model,
            gpu=spec.gpu_of(r),
            gpu_ids=gpu_ids(spec.pool_id, r.replica_id, spec.gpu_of(r)),
        )
        for r in spec.replicas
    ]
    return Pool(
        pool_id=spec.pool_id,
        engine=spec.engine,
        tags=spec.tags,
        replicas=replicas,
        price=spec.own_price(),
        spec=spec,
    )


def build_registry(specs: list[PoolSpec], settings: Settings) -> PoolRegistry:
    return PoolRegistry([build_pool(spec, settings) for spec in specs], settings)
