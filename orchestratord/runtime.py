"""The running service: database, event writer, hub, pools and dispatcher, started together."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from orchestrator_core.admission import AdmissionPolicy
from orchestrator_core.breakers import BreakerBoard
from orchestrator_core.flows import FlowLimits
from orchestrator_core.pricing import Price
from orchestrator_core.schemas.bounds import ValidationBound
from orchestratord import tracing
from orchestratord.auth.guard import KeyGuard
from orchestratord.auth.rates import KeyRates
from orchestratord.auth.streams import KeyStreams
from orchestratord.db.engine import Database
from orchestratord.db.migrate import upgrade
from orchestratord.db.models import Run, Step
from orchestratord.db.single_process import SingleProcessLock
from orchestratord.dispatcher import Dispatcher
from orchestratord.event_logging import EventLogLines, scrub_logs
from orchestratord.eventlog import RUN_END, EventWriter, LogEvent
from orchestratord.fs.guard import guard_for, make_data_roots
from orchestratord.gates.pool import CelPool
from orchestratord.metrics import Metrics
from orchestratord.pools.catalog import PoolCatalog
from orchestratord.pools.config import PoolConfigError, PoolSpec, load_pools_file, local_pool
from orchestratord.pools.provisioning.manager import Provisioning
from orchestratord.pools.registry import PoolRegistry, build_registry
from orchestratord.pools.sessions import RunSessions
from orchestratord.pools.slots import Slots
from orchestratord.prices import PriceBook
from orchestratord.reaper import LeaseKeeper
from orchestratord.scrubbing import scrubber_for
from orchestratord.settings import Settings
from orchestratord.steps import leases
from orchestratord.steps.failover import move_queued
from orchestratord.steps.leases import LeaseTerms
from orchestratord.steps.services import KindServices
from orchestratord.steps.submission import SubmitContext
from orchestratord.steps.transition import cancel_step
from orchestratord.streams.hub import Hub
from orchestratord.streams.wakeups import LogWakeups
from orchestratord.tools.executors import HttpToolSettings, ToolExecutors
from orchestratord.tx import Tx
from orchestratord.validation import Validation

log = logging.getLogger(__name__)


class Orchestrator:
    def __init__(self, settings: Settings, *, pools: PoolRegistry | None = None) -> None:
        self.settings = settings
        self.db = Database(
            settings.database_url,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
        )
        self.lock = SingleProcessLock.for_url(settings.database_url)
        self.hub = Hub(
            buffer_events=settings.stream.buffer_events,
            catch_up_turns=settings.stream.catch_up_turns or (1 if self.db.is_sqlite else 4),
        )
        self.wakeups = (
            None
            if self.db.is_sqlite
            else LogWakeups(settings.database_url, self.hub, self.db.origin)
        )
        self.metrics = Metrics()
        self.publish = EventLogLines(self._committed)
        self.writer = EventWriter(
            self.db,
            self.publish,
            max_pending=settings.dispatch.max_pending_events,
            observe=self.metrics.commit,
        )
        declared: list[PoolSpec] | None = None  # the pools file's set (None: given in code)
        if pools is None:
            declared = self._declared_pools()
            pools = build_registry(declared, settings)
            pools.managed = set(pools.pools)  # the file's: data, as the table will say
        self.pools = pools
        # the pools' and the database's credentials, kept out of what the service shows
        self.scrubber = scrubber_for(pools, urls=[settings.database_url])
        self.catalog = PoolCatalog(
            self.db, pools, self.scrubber, declared=declared, retire_s=settings.dispatch.drain_s
        )
        scrub_logs(self.scrubber)
        self.prices = (
            PriceBook.load(settings.price_tables_dir)
            if settings.price_tables_dir is not None
            else PriceBook.load()
        )
        if settings.price_table is not None:
            self.prices.get(settings.price_table)  # fail at start on an unknown version
        adm = settings.admission
        self.submit_context = SubmitContext(
            pools=self.pools,
            prices=self.prices,
            admission=AdmissionPolicy(
                capacity={"interactive": adm.interactive_capacity, "batch": adm.batch_capacity},
                on_full=adm.on_full,
                retry_after_ms=adm.retry_after_s * 1000,
            ),
            default_cancel_on_disconnect=settings.stream.cancel_on_disconnect,
            metrics=self.metrics,
            max_prompt_chars=settings.limits.max_prompt_chars,
        )
        auth, limits = settings.auth, settings.limits
        self.auth = KeyGuard(
            self.db,
            required=auth.enabled,
            cache_s=auth.cache_s,
            open_paths=frozenset({"/healthz", "/metrics"} if auth.open_metrics else {"/healthz"}),
            pepper=auth.pepper,
            max_failures_per_minute=auth.max_failures_per_minute,
            limited_wait_s=auth.limited_wait_s,
        )
        self.rates = KeyRates(
            self.db,
            requests_per_minute=limits.requests_per_minute,
            tokens_per_minute=limits.tokens_per_minute,
        )
        self.key_streams = KeyStreams(limits.max_followers_per_key)
        checks = settings.validation
        self.flow_limits = FlowLimits(
            max_tools=limits.max_tools_per_flow,
            max_tool_schema_bytes=limits.max_tool_schema_bytes,
            max_schema_nodes=checks.max_schema_nodes,
            max_unique_items=checks.max_unique_items,
        )
        self.validation = Validation(
            ValidationBound(
                deadline_s=checks.deadline_s,
                max_errors=checks.max_errors,
                inline_max_work=checks.inline_max_work,
            ),
            workers=checks.workers,
        )
        tools, breakers = settings.tools, settings.breakers
        self.services = KindServices(
            tools=ToolExecutors(
                HttpToolSettings(
                    default_timeout_ms=tools.default_timeout_ms,
                    max_reply_bytes=tools.max_reply_bytes,
                    max_retries=tools.max_retries,
                    backoff_s=tools.backoff_s,
                    max_connections=tools.max_connections,
                    allow=tools.allow_list(),
                )
            ),
            tool_breakers=BreakerBoard(breakers.config(breakers.tool_failures)),
            engine_breakers=BreakerBoard(breakers.config(breakers.engine_failures)),
            hub=self.hub,
            sessions=RunSessions(),
            fs=guard_for(settings),
            poll_s=settings.stream.poll_s,
            metrics=self.metrics,
            scrubber=self.scrubber,
            engine_limits=settings.engine_limits,
            cel=CelPool(settings.cel),
        )
        self.pools.watch_breakers(self.services.engine_breakers)
        dispatch = settings.dispatch
        self.leases = LeaseTerms.for_process(
            settings.instance,
            port=settings.port,
            lease_s=dispatch.lease_s,
            max_attempts=dispatch.max_attempts,
        )
        self.dispatcher = Dispatcher(
            self.db,
            self.pools,
            self.writer,
            self.prices,
            self.services,
            self.leases,
            poll_s=dispatch.poll_s,
            control_slots=tools.concurrency,
        )
        # an engine step whose pool has a free slot starts in its submission's transaction
        self.submit_context = replace(self.submit_context, starter=self.dispatcher)
        self.keeper = LeaseKeeper(
            self.db,
            self.leases,
            tx=self.tx,
            price_of=self._price_of,
            running=lambda: list(self.dispatcher.executions),
            abandon=self.dispatcher.abandon,
            requeued=self.dispatcher.wake_all,
        )
        self.provisioning = Provisioning(settings, self.catalog, owner=self.leases.instance)
        self._background: set[asyncio.Task[object]] = set()
        self.tracing: tracing.Tracing | None = None  # started with the service

    def _declared_pools(self) -> list[PoolSpec]:
        """The pools the settings declare: the pools file's, else ``--engine``'s local one."""
        settings = self.settings
        if settings.pools_file is not None:
            return load_pools_file(settings.pools_file)
        return local_pool(settings.engine, slots=settings.sim.slots)

    def reload_on_sighup(self) -> None:
        """Read the pools file again on SIGHUP (where the loop can take signals)."""
        try:
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGHUP, lambda: self._spawn(self.reload_pools())
            )
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            log.info("SIGHUP does not reload the pools file here")

    async def reload_pools(self) -> bool:
        """SIGHUP: the pools file read again; its set replaces what it declared before (a
        file with errors changes nothing: the log says what is wrong)."""
        if self.catalog.declared is None:
            return False
        try:
            specs = self._declared_pools()
        except PoolConfigError as exc:
            log.error("pools file not reloaded:\n%s", exc)
            return False
        await self.catalog.declare(specs)
        self.dispatcher.wake_all()
        log.info("pools file reloaded: %d pools declared", len(specs))
        return True

    def _committed(self, events: list[LogEvent]) -> None:
        """Committed events: to the live followers; a run that ended closes its engine
        sessions."""
        self.hub.publish(events)
        for ev in events:
            if ev.type == RUN_END:
                self._spawn(self.services.sessions.end_run(ev.run_id))

    async def start(self, *, migrate: bool = True) -> None:
        if self.lock is not None:
            self.lock.acquire()  # before anything is written: one process per SQLite file
        self.tracing = tracing.start(self.settings.tracing)
        make_data_roots(self.settings)
        if migrate:
            await upgrade(self.db)
        self.services.fs.refresh()  # the database file exists now
        await self.keeper.reap_on_start(single_process=self.db.is_sqlite)
        if self.wakeups is not None:
            await self.wakeups.start()
        await self.catalog.start()  # the pools file's set written; every stored pool served
        await self.provisioning.forget_stale()
        await self.pools.refresh()
        await self._read_drains()
        self.writer.start()
        self.dispatcher.start()
        self.keeper.start()
        self.dispatcher.wake_all()
        self._spawn(self._watch_health())

    async def drain(self, deadline_s: float) -> None:
        """Before shutdown: claim nothing more, let running steps finish for up to
        ``deadline_s``, then let go of the rest (their leases expire now, so another process,
        or this one at its next start, takes them over), and end every open stream so that
        its client resumes elsewhere with ``Last-Event-ID``."""
        self.dispatcher.pause()
        tasks = [e.task for e in self.dispatcher.executions.values() if e.task is not None]
        if tasks and deadline_s > 0:
            await asyncio.wait(tasks, timeout=deadline_s)
        left = list(self.dispatcher.executions)
        for step_id in left:
            self.dispatcher.abandon(step_id)
        await self.keeper.stop()
        if left:
            log.warning("let go of %d running steps at shutdown", len(left))
            await self.writer.wait_drained()
            async with self.db.write() as session:
                await leases.release(session, self.leases)
            if self.db.is_sqlite:  # no other process takes them over: reap them now
                await self.keeper.reap_expired()
        self.hub.close_all()

    async def stop(self) -> None:
        await self.keeper.stop()
        await self.rates.stop()
        await self.dispatcher.stop()
        await self.writer.stop()
        for task in list(self._background):
            task.cancel()
        await self.provisioning.aclose()
        await self.catalog.aclose()
        await self.pools.aclose()
        await self.services.aclose()
        if self.wakeups is not None:
            await self.wakeups.stop()
        self.validation.close()
        await self.db.dispose()
        await tracing.stop(self.tracing)  # the last spans exported
        if self.lock is not None:
            self.lock.release()

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[Tx]:
        """A write transaction; its events are published and callbacks run after commit."""
        tx: Tx | None = None
        try:
            async with self.db.write_tx() as on:
                tx = Tx(on)
                yield tx
        except BaseException:
            if tx is not None:
                tx.rolled_back()
            raise
        assert tx is not None
        self.publish(tx.events)
        for callback in tx.callbacks:
            callback()

    @property
    def hub_sees_every_write(self) -> bool:
        """Every commit reaches the hub: published by this process (one process on SQLite),
        or poking it through live wake-ups."""
        return self.db.is_sqlite or (self.wakeups is not None and self.wakeups.live)

    async def cancel_step(self, step_id: str) -> str:
        async with self.tx() as tx:
            status, running = await cancel_step(tx, step_id=step_id)
        if running:
            self.dispatcher.cancel(step_id)
        return status

    def _price_of(self, step: Step, run: Run) -> Price | None:
        """The price of an engine step's pool and model for its run (None: not known here)."""
        pool = self.pools.pools.get(step.pool_id) if step.pool_id is not None else None
        if pool is None:
            return None
        model = (step.input or {}).get("model") or pool.model_name
        try:
            return self.prices.resolve(
                run.price_table, engine=pool.engine, model=model, own=pool.price
            )
        except Exception:  # an unknown table: charged tokens, no cost
            return None

    def cancel_step_soon(self, step_id: str) -> None:
        """Cancel from a context that cannot wait (a stream being torn down)."""
        self._spawn(self.cancel_step(step_id))

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            try:
                await self.catalog.sync()  # pools created or removed through any process
                await self.provisioning.reap_idle()
                await self.pools.refresh()
                await self._read_drains()  # (claims read them too, under the pool's lock)
                await move_queued(self.db, self.pools)  # off pools that take no steps
            except Exception:
                log.exception("pool health refresh failed")
            self.dispatcher.wake()

    async def _read_drains(self) -> None:
        """The replicas an operator drained, through this process or another."""
        async with self.db.read() as session:
            self.pools.saw_draining(await Slots.draining(session))
