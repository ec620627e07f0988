"""What the submission rules share: the service they run in, the submission they resolve,
and what they answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from contracts.steps import AnyStepCreate
from orchestrator_core import clock
from orchestrator_core.admission import PRIORITY_RANK, AdmissionPolicy
from orchestrator_core.budgets import Ledger, Reservation, StepBudget
from orchestrator_core.generation import LlmInput
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.placement import Placed
from orchestrator_core.policy import Decision, PolicySubject
from orchestrator_core.pricing import Price
from orchestratord.db.models import Run, Step
from orchestratord.db.prepared import transient
from orchestratord.metrics import Metrics
from orchestratord.pools.registry import Pool, PoolRegistry, Replica
from orchestratord.prices import PriceBook
from orchestratord.replay.steps import ReplayTarget
from orchestratord.runs.kept import KeptRuns
from orchestratord.steps.kinds.base import StepKind
from orchestratord.steps.queries import ledger_of, same_request
from orchestratord.steps.running import ClaimedStep
from orchestratord.tx import Tx


class Starter(Protocol):
    """Starts an engine step in its submission's transaction (the dispatcher)."""

    def may_start(self) -> bool:
        """Steps may start (the process is not draining)."""
        ...

    async def look(self, session: AsyncSession, pool: Pool) -> None:
        """Before ``slot_for`` in ``session``'s transaction: the slots of ``pool`` that
        other processes hold (PostgreSQL; the pool's lock is held to the transaction's end)."""
        ...

    def slot_for(self, pool: Pool, run: Run) -> Replica | None:
        """A slot taken for a step of ``run`` on ``pool`` (its session's replica where the
        engine keeps sessions), or None; given back with ``give_back``."""
        ...

    def give_back(self, pool: Pool, replica: Replica) -> None:
        """A slot taken by a submission that stored no started step: free again, for a
        step queued meanwhile too."""
        ...

    def claim(self, step: Step, replica: Replica) -> None:
        """The step runs on ``replica``: running, leased (in the caller's transaction)."""
        ...

    def begin(self, claimed: ClaimedStep) -> None:
        """Its claim committed: execute it."""
        ...


@dataclass(frozen=True)
class SubmitContext:
    """What submission needs from the running service."""

    pools: PoolRegistry
    prices: PriceBook
    admission: AdmissionPolicy
    default_cancel_on_disconnect: bool
    metrics: Metrics = field(default_factory=Metrics)
    max_prompt_chars: int = 1_000_000
    starter: Starter | None = None  # None: every step waits for the dispatcher
    runs: KeptRuns = field(default_factory=KeptRuns)  # PostgreSQL: runs read before


@dataclass(frozen=True)
class Submitted:
    step: Step
    created: bool
    ledger: Ledger  # the run's account after this submission
    run: Run  # as the submission read it (its budgets and creation time do not change)


@dataclass
class Slot:
    """A slot ``StartNow`` took; given back once, whichever way the submission fails."""

    starter: Starter
    pool: Pool
    replica: Replica
    held: bool = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.starter.give_back(self.pool, self.replica)


class ReadAgain(Exception):
    """A submission from a kept run met what only a fresh read of the run decides."""


@dataclass
class Submission:
    """One submission as the rules resolve it."""

    tx: Tx
    ctx: SubmitContext
    run_id: str
    body: AnyStepCreate
    request_hash: str = ""
    run: Run = field(init=False)
    kind: StepKind = field(init=False)
    stored: dict[str, Any] = field(default_factory=dict)
    placement: Any = None
    pool_id: str | None = None
    placed: Placed | None = None  # why the step goes to ``pool_id``
    target: ReplayTarget | None = None
    decision: Decision = field(init=False)
    llm: LlmInput | None = None
    price: Price | None = None
    tokens_in: int = 0
    verdict: str = "admit"
    slot: Slot | None = None  # StartNow: the free slot the step took
    queue_unchecked: bool = False  # StartNow left the pool's queue to Insert's statement
    announce: Callable[[Step], None] | None = None  # see ``submit_step``
    kept: dict[str, Any] | None = None  # the run as kept, not read (see the package's docstring)
    subject: PolicySubject | None = None  # a kept run's: its decision is not yet recorded

    @property
    def session(self) -> AsyncSession:
        return self.tx.session

    @property
    def db(self) -> Tx:
        """Where its prepared statements run (no session is made for them alone)."""
        return self.tx

    @property
    def sqlite(self) -> bool:
        return self.tx.sqlite

    @property
    def ledger(self) -> Ledger:
        """The run's account as the submission read it (or as the process kept it)."""
        return ledger_of(self.run)

    @cached_property
    def budget(self) -> StepBudget:
        """The budgets the step is submitted under: its run's and its own."""
        body = self.body
        step_budgets = body.budgets.model_dump() if body.budgets else None
        return StepBudget.of(self.run.budgets, step_budgets, self.run.created_at)

    def plan(self, ledger: Ledger) -> Reservation:
        """The step's reservation against ``ledger``, or ``BudgetExceeded``."""
        if not self.kind.engine:
            return self.budget.plan_unmetered()
        assert self.llm is not None and self.price is not None
        return self.budget.plan(
            ledger,
            tokens_in=self.tokens_in,
            max_tokens=self.llm.params.max_tokens,
            price=self.price,
        )

    def repeat(self, step: Step) -> Submitted:
        return Submitted(same_request(step, self.request_hash), False, self.ledger, self.run)

    def claim(self, step: Step) -> ClaimedStep | None:
        """``StartNow`` took a slot: the step is inserted running, leased, on its replica."""
        slot, starter = self.slot, self.ctx.starter
        if slot is None or starter is None:
            return None
        starter.claim(step, slot.replica)
        return ClaimedStep(step, self.run, self.price, slot.pool, slot.replica)

    def begin_after_commit(self, started: ClaimedStep | None) -> None:
        """A step claimed (``claim``) executes once its submission commits."""
        if started is not None:
            starter = self.ctx.starter
            assert starter is not None
            self.tx.after_commit(lambda: starter.begin(started))


class Rule(Protocol):
    async def apply(self, sub: Submission) -> Submitted | None: ...


def build_step(sub: Submission, *, position: int, reservation: Reservation | None) -> Step:
    """The step the submission stores (not yet added to any session)."""
    body = sub.body
    cod = body.cancel_on_disconnect
    if cod is None:
        cod = sub.run.cancel_on_disconnect
    metered = reservation is not None and sub.kind.engine
    return transient(
        Step,
        dict(
            step_id=clock.new_id("step"),
            run_id=sub.run_id,
            position=position,
            type=body.type,
            client_token=body.client_token,
            request_hash=sub.request_hash,
            input=sub.stored,
            budgets=body.budgets.model_dump() if body.budgets else None,
            placement=sub.placement,
            cancel_on_disconnect=sub.ctx.default_cancel_on_disconnect if cod is None else cod,
            status=StepStatus.QUEUED.value,
            priority=body.priority,
            priority_rank=PRIORITY_RANK[body.priority],
            max_tokens_granted=reservation.tokens_out if metered and reservation else None,
            budget_clamped=reservation.clamped if reservation else False,
            decode_seconds_granted=reservation.decode_seconds if reservation else None,
            tokens_in_reserved=reservation.tokens_in if reservation else 0,
            tokens_out_reserved=reservation.tokens_out if reservation else 0,
            cost_reserved_usd=reservation.cost_usd if reservation else 0.0,
            policy_decision={
                "rule_id": sub.decision.rule_id,
                "redactions": [r.rule_id for r in sub.decision.redactions],
            },
            cancel_requested=False,
            attempts=0,
            pool_id=sub.pool_id,
            placement_decision=None if sub.placed is None else sub.placed.as_dict(),
            tokens_in=0,
            tokens_out=0,
            cost_usd=0.0,
            created_at=clock.now(),
        ),
    )
