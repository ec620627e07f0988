"""The dispatcher: claims queued steps when their lane has a free slot and runs them.

A lane is a pool of engines (steps of engine kinds), or the control plane itself (steps of
kinds that run here: tool calls...), which takes ``control_slots`` steps at a time.

Claims are atomic (``UPDATE ... WHERE status='queued'`` after ``SELECT ... FOR UPDATE SKIP
LOCKED`` on PostgreSQL), so several processes can share one database without running a step
twice. On PostgreSQL a round first reads, in one statement with no transaction, which lanes
have a step queued, and claims only there (a round of every lane finding nothing, as when
steps start with their submission, is one round trip, not three per lane).

A claim leases the step to this process (``steps/leases.py``; the lease keeper in
``reaper.py`` renews it). A replica never gets more concurrent requests than its slots.
A cancel made through this process reaches its execution directly; one requested through
another process is picked up by polling ``cancel_requested`` at most once per ``poll_s``
(not on every wake: under load a wake comes with every submission and every ended step).

A round that finds the database unavailable (down, restarting: ``db/outage.py``) is tried
again every ``poll_s`` with every lane looked at, as a claim it could not make may have
been asked for meanwhile; one line is logged per outage, not a traceback per round.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core.lifecycle import StepStatus
from orchestratord import tracing
from orchestratord.db.engine import Database
from orchestratord.db.models import Run, Step
from orchestratord.db.outage import described, unavailable
from orchestratord.eventlog import EventWriter
from orchestratord.pools.registry import Pool, PoolRegistry, Replica
from orchestratord.pools.slots import Slots
from orchestratord.prices import PriceBook
from orchestratord.steps.leases import LeaseTerms
from orchestratord.steps.queries import cancel_requested_among, claim_queued, queued_lanes
from orchestratord.steps.running import ClaimedStep, Execution
from orchestratord.steps.services import KindServices
from orchestratord.steps.transition import transition
from orchestratord.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        db: Database,
        pools: PoolRegistry,
        writer: EventWriter,
        prices: PriceBook,
        services: KindServices,
        leases: LeaseTerms,
        *,
        poll_s: float = 0.5,
        control_slots: int = 64,
    ) -> None:
        self.db = db
        self.services = services
        self.leases = leases
        self.paused = False  # draining: running steps finish, no step is claimed
        self.control_slots = control_slots
        self._control_running = 0
        # Whether steps may be waiting, per lane kind: a claim round costs a write
        # transaction, so it runs when a submission or a freed slot said so, or on a poll
        # (a step submitted through another process).
        self._control_hint = True
        self._pool_hint = True
        # Pools whose last claim round may have left steps queued (it filled every free slot,
        # or a step waits for its pinned replica). On SQLite this process sees every
        # submission (each wakes it), so a freed slot of a pool whose queue the last round
        # drained needs no claim round; on PostgreSQL other processes submit too, so a freed
        # slot looks when the last look is ``poll_s`` old (a busy process is woken too often
        # to reach its quiet poll; looking at every freed slot cost an empty claim
        # transaction, three round trips, per step).
        self._backlog: dict[str, bool] = {}
        self._looked: dict[str, float] = {}  # when each pool's last claim round ran
        self.prices = prices
        self.pools = pools
        self.writer = writer
        self.poll_s = poll_s
        self.executions: dict[str, Execution] = {}
        self.slots = Slots(shared=not db.is_sqlite)
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._cancels_at = float("-inf")  # when to look for other processes' cancels next
        self._unavailable = False  # the last round found the database unavailable

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="dispatcher")

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop claiming between two rounds, then stop the running steps.

        The loop is not cancelled in the middle of a claim: a transaction cut there could
        leave its connection, and the row locks it holds, behind until it is collected, and
        the event writer's last commit would wait on them."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            try:
                async with asyncio.timeout(grace_s):
                    await asyncio.shield(self._task)
            except TimeoutError:
                await cancel_and_wait(self._task)
        for execution in list(self.executions.values()):
            execution.request_cancel()
        tasks = [e.task for e in self.executions.values() if e.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)

    def wake(self, *, control: bool = False) -> None:
        """Run a round soon: for the control lane (``control``), else for the pools."""
        if control:
            self._control_hint = True
        else:
            self._pool_hint = True
        self._wake.set()

    def wake_all(self) -> None:
        """Run a round soon for every lane (steps were queued again, or at start)."""
        self._control_hint = True
        self.wake()

    def pause(self) -> None:
        """Claim nothing more (a drain before shutdown); running steps go on."""
        self.paused = True

    def abandon(self, step_id: str) -> None:
        """Stop running a step this process no longer holds (its lease was taken over, or
        it is let go at shutdown): nothing more of it is written here."""
        execution = self.executions.get(step_id)
        if execution is not None:
            execution.abandon()

    def cancel(self, step_id: str) -> bool:
        execution = self.executions.get(step_id)
        if execution is None:
            return False
        execution.request_cancel()
        return True

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                async with asyncio.timeout(self.poll_s):
                    await self._wake.wait()
            except TimeoutError:
                self._quiet_poll()
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.dispatch_once()
                await self._poll_cancels()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)
                await asyncio.sleep(self.poll_s)
            else:
                if self._unavailable:
                    self._unavailable = False
                    log.info("database back: dispatching again")

    def _failed(self, exc: Exception) -> None:
        """A round failed: the next one looks at every lane (the hints this one cleared,
        and the steps a claim it could not make would have started, are not lost)."""
        self._control_hint = self._pool_hint = True
        for pool_id in self.pools.pools:
            self._backlog[pool_id] = True
        if unavailable(exc) is None:
            log.exception("dispatch round failed")
        elif not self._unavailable:
            self._unavailable = True
            log.warning("database unavailable (%s): dispatching waits for it", described(exc))

    def _quiet_poll(self) -> None:
        """A wait ended with no wake-up: look where steps may wait unseen. Other processes
        submit to a shared PostgreSQL: everywhere. On SQLite this process sees every
        submission, requeue, freed slot and health refresh (each wakes it): only a lane whose
        last round left steps queued needs another look (an idle server claims nothing)."""
        if not self.db.is_sqlite:
            self._control_hint = self._pool_hint = True
            return
        # the control lane's hint stays set while its last round left steps queued
        self._pool_hint = any(self._backlog.get(p, True) for p in self.pools.pools)

    async def dispatch_once(self) -> int:
        if self.paused:
            return 0
        started = 0
        pools = list(self.pools.pools.values()) if self._pool_hint else []
        self._pool_hint = False
        if not self.db.is_sqlite:
            pools = await self._where_queued(pools)
        for pool in pools:
            waiting = True  # a full pool: steps may be queued behind it
            while not pool.full_here:
                claimed: list[tuple[ClaimedStep, Replica]] = []
                try:
                    async with self.db.write() as session:
                        await self.slots.look(session, pool)  # other processes' slots
                        if (free := pool.free_slots) <= 0:
                            break
                        full = [r.replica_id for r in pool.replicas if r.free == 0]
                        rows = await claim_queued(
                            session, pool_id=pool.pool_id, limit=free, full_replicas=full
                        )
                        for step, run in rows:
                            pinned = step.replica_id if step.replay_of else None
                            pinned = pinned or self._session_replica(pool, run)
                            replica = pool.acquire(pinned)
                            if replica is None:
                                if pinned is not None:
                                    continue  # waits for its replica; the others may go
                                break
                            model = (step.input or {}).get("model") or pool.model_name
                            price = self.prices.resolve(
                                run.price_table, engine=pool.engine, model=model, own=pool.price
                            )
                            claimed.append((ClaimedStep(step, run, price, pool, replica), replica))
                            self.claim(step, replica)
                except BaseException:
                    for _, replica in claimed:
                        pool.release(replica)
                    raise
                self._start([item for item, _ in claimed])
                started += len(claimed)
                # passed over (pinned to a full replica, in SQL or here) or not all read
                waiting = len(rows) >= free or len(claimed) < len(rows) or bool(full)
                if len(rows) < free or not claimed:
                    break
            self._backlog[pool.pool_id] = waiting
            self._looked[pool.pool_id] = asyncio.get_running_loop().time()
        return started + await self._dispatch_control()

    async def _where_queued(self, pools: list[Pool]) -> list[Pool]:
        """PostgreSQL: of the lanes a round would claim from (pools with a free slot, the
        control plane's with its hint), those where a step is queued, in one read with no
        transaction (a claim finding nothing costs BEGIN, the locking read and COMMIT); the
        others are looked at, with nothing left queued. Full pools stay (nothing is claimed
        there, but steps may wait behind them)."""
        control = self._control_hint and self.control_slots > self._control_running
        if not control and all(pool.full_here for pool in pools):
            return pools
        async with self.db.driver_write() as target:
            lanes = await queued_lanes(target)
        if None not in lanes:
            self._control_hint = False
        now = asyncio.get_running_loop().time()
        kept = []
        for pool in pools:
            if not pool.full_here and pool.pool_id not in lanes:
                self._backlog[pool.pool_id] = False
                self._looked[pool.pool_id] = now
            else:
                kept.append(pool)
        return kept

    # Steps started in their submission's transaction (``steps/submission/rules.py: StartNow``).

    def may_start(self) -> bool:
        return not self.paused and not self._stopping

    async def look(self, session: AsyncSession, pool: Pool) -> None:
        await self.slots.look(session, pool)

    def slot_for(self, pool: Pool, run: Run) -> Replica | None:
        return pool.acquire(self._session_replica(pool, run))

    def give_back(self, pool: Pool, replica: Replica) -> None:
        pool.release(replica)
        if self._may_wait(pool.pool_id):  # a step queued while the slot was taken
            self.wake()

    def claim(self, step: Step, replica: Replica) -> None:
        transition(step, StepStatus.RUNNING)
        self.leases.grant(step)
        step.replica_id = replica.replica_id
        if (decision := step.placement_decision) is not None:  # the replica it runs on
            chosen = {**decision["chosen"], "replica_id": replica.replica_id}
            step.placement_decision = {**decision, "chosen": chosen}

    def begin(self, claimed: ClaimedStep) -> None:
        self._start([claimed])

    def _session_replica(self, pool: Pool, run: Run) -> str | None:
        """Where the run's engine session is, on a pool whose engine keeps sessions."""
        if not pool.session_bound:
            return None
        parent = (run.forked_from or {}).get("run_id")
        return self.services.sessions.placement_of(run.run_id, pool.pool_id, parent)

    async def _dispatch_control(self) -> int:
        """Steps that run in the control plane: claimed as pool steps are, without a pool."""
        started = 0
        while self._control_hint and (free := self.control_slots - self._control_running) > 0:
            async with self.db.write() as session:
                rows = await claim_queued(session, pool_id=None, limit=free)
                for step, _ in rows:
                    transition(step, StepStatus.RUNNING)
                    self.leases.grant(step)
            self._control_running += len(rows)
            self._start([ClaimedStep(step, run) for step, run in rows])
            started += len(rows)
            if len(rows) < free:
                self._control_hint = False
        return started

    def _start(self, claimed: list[ClaimedStep]) -> None:
        for item in claimed:
            stale = self.executions.get(item.step.step_id)
            if stale is not None:  # its lease ran out while this process stalled
                stale.abandon()
            execution = Execution(item, self.writer, self.services, self._finished)
            self.executions[execution.step_id] = execution
            with tracing.claimed(item.step):  # the step's task joins its submission's trace
                execution.start()

    def _finished(self, execution: Execution) -> None:
        if self.executions.get(execution.step_id) is execution:
            del self.executions[execution.step_id]
        if execution.pool is not None and execution.replica is not None:
            execution.pool.release(execution.replica)
            if self._may_wait(execution.pool.pool_id):
                self.wake()
        else:
            self._control_running -= 1
            self.wake(control=True)

    def _may_wait(self, pool_id: str) -> bool:
        """Whether steps may be queued for the pool: its last claim round left some, or
        (PostgreSQL) other processes may have queued some since it ran, ``poll_s`` ago."""
        if self._backlog.get(pool_id, True):
            return True
        if self.db.is_sqlite:
            return False
        now = asyncio.get_running_loop().time()
        return now - self._looked.get(pool_id, float("-inf")) >= self.poll_s

    async def _poll_cancels(self) -> None:
        now = asyncio.get_running_loop().time()
        if now < self._cancels_at:
            return
        local = [sid for sid, e in self.executions.items() if not e.cancel_event.is_set()]
        if not local:
            return
        self._cancels_at = now + self.poll_s
        async with self.db.read() as session:
            for step_id in await cancel_requested_among(session, step_ids=local):
                self.cancel(step_id)
