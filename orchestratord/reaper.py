"""The lease keeper: renews this process's step leases and reaps the leases that expired.

Every ``lease_s / 3`` (jittered, so processes started together do not reap in step): one
statement renews every lease this process holds; a step it runs that it no longer holds
(reaped by another process while this one stalled) is abandoned here: its execution stops
without writing more. Then expired leases are reaped (``steps/leases.py``), in transactions
of at most 50 steps, each step locked with SKIP LOCKED so two reapers never take one step.

While the database is unavailable no process can renew its leases, so they all expire
together, the living processes' as well as a dead one's. Once it is back, this process
renews its own at once, and reaps nothing until ``lease_s`` after the last round that found
the database unavailable: every living process has renewed by then (each renews every
third of a lease), so what is still expired belongs to a process that is gone. (Reaping
first would take running steps from processes that lived through the outage: a tool call
ended as ``WORKER_LOST`` while it was still running.)
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager

from sqlalchemy.ext.asyncio import AsyncSession

from orchestratord.db.engine import Database
from orchestratord.db.models import Step
from orchestratord.db.outage import described, unavailable
from orchestratord.steps import leases
from orchestratord.steps.leases import LeaseTerms, PriceOf
from orchestratord.tasks import cancel_and_wait
from orchestratord.tx import Tx

log = logging.getLogger(__name__)

TxFactory = Callable[[], AbstractAsyncContextManager[Tx]]
Select = Callable[[AsyncSession], Awaitable[list[Step]]]


class LeaseKeeper:
    def __init__(
        self,
        db: Database,
        terms: LeaseTerms,
        *,
        tx: TxFactory,
        price_of: PriceOf,
        running: Callable[[], Iterable[str]],
        abandon: Callable[[str], None],
        requeued: Callable[[], None],
    ) -> None:
        self.db = db
        self.terms = terms
        self._tx = tx
        self._price_of = price_of
        self._running = running
        self._abandon = abandon
        self._requeued = requeued
        self._task: asyncio.Task[None] | None = None
        self.reaped = 0
        self.requeued = 0
        # (the loop's clock) when a round last found the database unavailable
        self._unavailable_at: float | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="lease-keeper")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _loop(self) -> None:
        every = self.terms.renew_every_s
        while True:
            await asyncio.sleep(every * random.uniform(0.8, 1.0))
            try:
                await self.renew()
                if self.may_reap():
                    await self.reap_expired()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if unavailable(exc) is None:
                    log.exception("lease renewal or reaping failed")
                    continue
                if self._unavailable_at is None:
                    log.warning(
                        "database unavailable (%s): leases are renewed, and expired ones "
                        "reaped, once it is back",
                        described(exc),
                    )
                self._unavailable_at = asyncio.get_running_loop().time()

    def may_reap(self) -> bool:
        """Whether expired leases are reaped now: not until ``lease_s`` after the database
        was last found unavailable, so that every process that lived through it has
        renewed its own."""
        if self._unavailable_at is None:
            return True
        if asyncio.get_running_loop().time() - self._unavailable_at < self.terms.lease_s:
            return False
        self._unavailable_at = None
        log.info("database back for a lease: expired leases are reaped again")
        return True

    async def renew(self) -> None:
        running = list(self._running())  # one begun meanwhile has a lease fresh enough
        if not running:
            return
        async with self.db.write() as session:
            held = await leases.renew(session, self.terms, running)
        missing = [sid for sid in running if sid not in held]
        if not missing:
            return
        async with self.db.read() as session:
            lost = await leases.held_elsewhere(session, self.terms, missing)
        for step_id in lost:
            log.warning("step %s: its lease was taken over; abandoning it here", step_id)
            self._abandon(step_id)

    async def reap_expired(self) -> int:
        """Reap steps whose lease expired; how many."""
        return await self._reap_rounds(leases.expired)

    async def reap_on_start(self, *, single_process: bool) -> int:
        """At start: every running step when this process is the only one (SQLite), else
        the steps an earlier incarnation of this instance held, then any expired lease."""
        if single_process:
            return await self._reap_rounds(leases.running_steps, once=True)
        terms = self.terms
        mine = await self._reap_rounds(lambda s: leases.held_by_earlier_self(s, terms), once=True)
        return mine + await self.reap_expired()

    async def _reap_rounds(self, select: Select, *, once: bool = False) -> int:
        total = 0
        while True:
            requeued = 0
            async with self._tx() as tx:
                steps = await select(tx.session)
                for step in steps:
                    if await leases.reap(tx, step, self.terms, self._price_of):
                        requeued += 1
            n = len(steps)
            total += n
            self.reaped += n
            self.requeued += requeued
            if n:
                log.warning("reaped %d steps whose process was lost (%d queued again)", n, requeued)
            if requeued:
                self._requeued()
            if once or n < 50:
                return total
