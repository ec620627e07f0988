"""Running one claimed step: its kind executes, this runner does what every kind shares.

Shared: the task, cancel requests, the budget deadline (wall and cost budgets allow so long;
then ``stop`` is set with ``budget_stop``), backpressure is the kind's (it emits), the
terminal event committed with the step's row in one transaction, and a step whose code
broke ended as a restart would end it, never left running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator_core import clock
from orchestrator_core.budgets import Limits, step_deadline_ms
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.pricing import Price
from orchestratord import tracing
from orchestratord.db.models import Run, Step
from orchestratord.eventlog import EventWriter, StepLog
from orchestratord.pools.registry import Pool, Replica
from orchestratord.scrubbing import scrub_ending
from orchestratord.steps.ends import ending_finalizer
from orchestratord.steps.kinds import kind_of
from orchestratord.steps.kinds.base import StepContext
from orchestratord.steps.queries import get_step, next_seq
from orchestratord.steps.services import KindServices
from orchestratord.steps.transition import end_interrupted
from orchestratord.tx import Tx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedStep:
    """Snapshots of a claimed step and its run, plus what the dispatcher resolved (engine
    kinds: the price, pool and replica)."""

    step: Step
    run: Run
    price: Price | None = None
    pool: Pool | None = None
    replica: Replica | None = None


class Execution:
    def __init__(
        self,
        claimed: ClaimedStep,
        writer: EventWriter,
        services: KindServices,
        on_done: Callable[[Execution], None],
    ) -> None:
        self.claimed = claimed
        self.step_id = claimed.step.step_id
        self.pool = claimed.pool
        self.replica = claimed.replica
        self.writer = writer
        self.services = services
        self.on_done = on_done
        self.cancel_event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._ctx: StepContext | None = None
        self.abandoned = False

    def start(self) -> None:
        self.task = asyncio.create_task(self._guarded(), name=f"step-{self.step_id}")

    def request_cancel(self) -> None:
        self.cancel_event.set()

    def abandon(self) -> None:
        """Stop at once, writing nothing more: the step is no longer this process's."""
        self.abandoned = True
        if self._ctx is not None:
            self._ctx.log.fenced = True
        self.writer.drop(self.step_id)
        if self.task is not None:
            self.task.cancel()

    def _stop_for_budget(self) -> None:
        if self._ctx is not None:
            self._ctx.budget_stop = True
        self.cancel_event.set()

    async def _guarded(self) -> None:
        step = self.claimed.step
        # its streams are served from memory while they keep up (the step's log is empty
        # unless it runs again after its process was lost)
        self.services.hub.hold_step(
            self.step_id,
            cancel_on_disconnect=step.cancel_on_disconnect,
            whole=step.attempts <= 1,
        )
        try:
            await self.run()
        except Exception:
            if self.abandoned:
                return
            log.exception("step %s: execution failed", self.step_id)
            await self._end_after_failure()
        finally:
            self.services.hub.release_step(self.step_id, keep=not self.abandoned)
            self.on_done(self)

    async def _end_after_failure(self) -> None:
        """The log could not be written (or the code broke): end the step as a restart would,
        so it is not left running."""
        db = self.writer.db
        try:
            async with db.write() as session:
                tx = Tx(session)
                step = await get_step(session, step_id=self.step_id, lock=True)
                if not StepStatus(step.status).terminal:
                    await end_interrupted(
                        tx, step=step, message="the step failed inside orchestratord; see its logs"
                    )
                    self.services.metrics.steps.labels(step.type, "failed").inc()
            self.writer.publish(tx.events)
            self.writer.forget(self.step_id)
        except Exception:
            log.exception("step %s: could not be ended; a restart will end it", self.step_id)

    async def run(self) -> None:
        step, run = self.claimed.step, self.claimed.run
        deadline = step_deadline_ms(
            run=Limits.from_dict(run.budgets),
            step=Limits.from_dict(step.budgets),
            run_elapsed_ms=(clock.now() - run.created_at).total_seconds() * 1000,
            decode_seconds=step.decode_seconds_granted,
        )
        log = StepLog(self.writer, step.run_id, step.step_id)
        if step.attempts > 1:  # queued again after its process was lost: its log goes on
            async with self.writer.db.read() as session:
                seq = await next_seq(session, step_id=step.step_id)
            if seq > 0:
                log.resume(seq)
        log.fenced = self.abandoned
        self._ctx = ctx = StepContext(
            step=step,
            run=run,
            log=log,
            db=self.writer.db,
            services=self.services,
            stop=self.cancel_event,
            deadline_s=None if deadline is None else deadline / 1000,
            price=self.claimed.price,
            pool=self.pool,
            replica=self.replica,
        )
        timer = (
            asyncio.get_running_loop().call_later(deadline / 1000, self._stop_for_budget)
            if deadline is not None
            else None
        )
        try:
            # an upstream error may quote a credential: kept out of the event and the record
            ending = scrub_ending(await kind_of(step.type).execute(ctx), self.services.scrubber)
        finally:
            if timer is not None:
                timer.cancel()
        with tracing.span("step.end", step, status=ending.status.value):
            await ctx.log.close(ending.event, ending_finalizer(step.step_id, step.run_id, ending))
        self.services.metrics.steps.labels(step.type, ending.status.value).inc()
