from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import placement_to_json
from contracts.steps import LlmCallInput, StepCreate
from orchestrator_core import budgets, clock
from orchestrator_core.admission import PRIORITY_RANK, AdmissionPolicy, admit, dropped_error
from orchestrator_core.budgets import BudgetExceeded, Ledger, Limits, Reservation
from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import (
    Conflict,
    InvalidParams,
    NotFound,
    PoolUnavailable,
    Unsupported,
)
from orchestrator_core.event_order import EventOrder, EventType
from orchestrator_core.generation import llm_input_of
from orchestrator_core.lifecycle import (
    RunStatus,
    StepStatus,
    check_run_accepts_steps,
    check_step_transition,
)
from orchestrator_core.placement import choose_pool
from orchestrator_core.policy import Decision, PolicyDenied, PolicySubject, RulePolicy, redact_json
from orchestratord.db.models import Event, Run, Step
from orchestratord.eventlog import make_event
from orchestratord.policies import policy_of
from orchestratord.pools import Pool, PoolRegistry
from orchestratord.prices import PriceBook
from orchestratord.repo.budgets import read_ledger, reserve, settle
from orchestratord.repo.replay_steps import (
    ReplayTarget,
    key_of,
    lock_run,
    replay_target,
    serve_recorded,
)
from orchestratord.tx import Tx

policy_log = logging.getLogger("orchestratord.policy")

SERVED_STEP_TYPES = ("llm_call",)


def validate_step_input(step_type: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Validate ``input`` for its type; errors name ``input.<field>``."""
    if step_type not in SERVED_STEP_TYPES:
        raise Unsupported(
            f"step type {step_type!r} is not served yet",
            details={"field": "type", "supported": list(SERVED_STEP_TYPES)},
        )
    try:
        parsed = LlmCallInput.model_validate(raw)
    except ValidationError as exc:
        errors = [
            {
                "field": ".".join(["input", *(str(p) for p in err["loc"])]),
                "message": err["msg"],
            }
            for err in exc.errors()
        ]
        first = errors[0]
        raise InvalidParams(
            first["message"], field=first["field"], details={"errors": errors}
        ) from exc
    return parsed.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class SubmitContext:
    """What submission needs from the running service."""

    pools: PoolRegistry
    prices: PriceBook
    admission: AdmissionPolicy
    default_cancel_on_disconnect: bool


async def submit_step(tx: Tx, *, run_id: str, body: StepCreate, ctx: SubmitContext) -> Submitted:
    """Store a step once per (run, client_token); a repeat returns the first (created=False).

    In order: idempotency, input validation, placement, policy (deny, redact), price,
    admission, then the budget reservation and the insert in one savepoint. In a replay run
    the step is matched with the recorded step at its position first (``replay_steps``):
    placement is the recorded pool and replica, and a step no engine needs to run again is
    served from the record (or ends with ``REPLAY_MISS``) without price or admission.
    """
    session = tx.session
    run = await session.get(Run, run_id)
    if run is None:
        raise NotFound("run", run_id)
    request_hash = sha256_of(body.model_dump(mode="json", exclude={"client_token"}))
    existing = await _by_token(session, run_id, body.client_token)
    if existing is not None:
        return Submitted(_same_request(existing, request_hash), False, ledger_of(run))
    check_run_accepts_steps(RunStatus(run.status))
    step_input = validate_step_input(body.type, body.input)
    placement = placement_to_json(body.placement)
    target: ReplayTarget | None = None
    pool_id: str | None
    if run.mode == "record":
        effective = placement if placement is not None else run.pool_policy
        pool_id = choose_pool(
            effective, ctx.pools.views(), field="placement" if placement else "pool_policy"
        )
    else:
        if run.mode == "strict_replay" and not _is_sqlite(session):
            # it may go through admission: take that lock first, as record submissions do
            await _admission_lock(session, body.priority)
        run = await lock_run(session, run_id)
        existing = await _by_token(session, run_id, body.client_token)  # raced the lock
        if existing is not None:
            return Submitted(_same_request(existing, request_hash), False, ledger_of(run))
        check_run_accepts_steps(RunStatus(run.status))  # it may have been cancelled meanwhile
        target = await replay_target(session, run)
        pool_id = target.pool_id
    pool = ctx.pools.get(pool_id) if pool_id is not None else None
    model = step_input.get("model") or (
        pool.model_name if pool is not None else target.model if target is not None else None
    )
    subject = PolicySubject(step_type=body.type, model=model, pool=pool_id)
    decision = enforce_logged(run.run_id, policy_of(run), subject)
    if decision.patterns:
        step_input = redact_json(step_input, decision.patterns)
    llm = llm_input_of(step_input)
    cod = body.cancel_on_disconnect
    if cod is None:
        cod = run.cancel_on_disconnect
    row = _StepRow(
        run_id=run_id,
        body=body,
        request_hash=request_hash,
        step_input=step_input,
        placement=placement,
        cancel_on_disconnect=ctx.default_cancel_on_disconnect if cod is None else cod,
        pool_id=pool_id,
        decision=decision,
    )
    if target is not None:
        target.compare(key_of(body.type, llm, run.seed))
        if not target.executes(run.mode, ctx.pools):
            return await _submit_unexecuted(tx, run=run, row=row, target=target)
    assert pool_id is not None
    pool = ctx.pools.require(pool_id)
    if target is not None:
        _require_ready_replica(pool, target)
    model = step_input.get("model") or pool.model_name
    price = ctx.prices.get(run.price_table).price_for(pool.engine, model)
    tokens_in = pool.count_prompt_tokens(llm)
    verdict = await _admit(session, ctx.admission, body.priority, postgres=not _is_sqlite(session))
    run_limits = Limits.from_dict(run.budgets)
    step_limits = Limits.from_dict(body.budgets.model_dump() if body.budgets else None)

    async def reserve_and_insert() -> Step:
        ledger = ledger_of(run)  # current on SQLite (the write lock is ours); re-read if stale
        for attempt in range(3):
            try:
                reservation = budgets.plan(
                    run=run_limits,
                    step=step_limits,
                    ledger=ledger,
                    tokens_in=tokens_in,
                    max_tokens=llm.params.max_tokens,
                    price=price,
                    run_elapsed_ms=(clock.now() - run.created_at).total_seconds() * 1000,
                )
            except BudgetExceeded:
                if attempt == 0 and not sqlite:
                    ledger = await read_ledger(session, run_id=run_id)
                    continue
                raise
            taken = await reserve(
                session, run_id=run_id, limits=run_limits, reservation=reservation
            )
            if taken is not None:
                break
            ledger = await read_ledger(session, run_id=run_id)
        else:
            raise Conflict("the run's budget kept changing while reserving; retry", retriable=True)
        position, ledger_after[0] = taken
        if verdict == "drop_oldest":
            await _drop_oldest(tx, ctx.admission, body.priority)
        if target is not None and position != target.position:
            raise Conflict(
                "the replay run's position moved during submission; retry", retriable=True
            )
        step = row.build(position=position, reservation=reservation)
        if target is not None and target.recorded is not None:
            step.replay_of = target.recorded.step_id
            step.replica_id = target.recorded.replica_id  # pinned: the dispatcher honours it
        session.add(step)
        await session.flush()
        return step

    sqlite = _is_sqlite(session)
    ledger_after: list[Ledger] = [ledger_of(run)]
    if sqlite:  # writes are serialized: the token check above cannot be raced
        step = await reserve_and_insert()
        return Submitted(step, True, ledger_after[0])
    try:
        async with session.begin_nested():
            step = await reserve_and_insert()
    except IntegrityError:
        existing = await _by_token(session, run_id, body.client_token)
        if existing is None:
            raise
        return Submitted(_same_request(existing, request_hash), False, ledger_of(run))
    return Submitted(step, True, ledger_after[0])


@dataclass(frozen=True)
class _StepRow:
    """What a new step row holds before its position and reservation are known."""

    run_id: str
    body: StepCreate
    request_hash: str
    step_input: dict[str, Any]
    placement: Any
    cancel_on_disconnect: bool
    pool_id: str | None
    decision: Decision

    def build(self, *, position: int, reservation: Reservation | None) -> Step:
        body = self.body
        return Step(
            step_id=clock.new_id("step"),
            run_id=self.run_id,
            position=position,
            type=body.type,
            client_token=body.client_token,
            request_hash=self.request_hash,
            input=self.step_input,
            budgets=body.budgets.model_dump() if body.budgets else None,
            placement=self.placement,
            cancel_on_disconnect=self.cancel_on_disconnect,
            status=StepStatus.QUEUED.value,
            priority=body.priority,
            priority_rank=PRIORITY_RANK[body.priority],
            max_tokens_granted=reservation.tokens_out if reservation else None,
            budget_clamped=reservation.clamped if reservation else False,
            decode_seconds_granted=reservation.decode_seconds if reservation else None,
            tokens_in_reserved=reservation.tokens_in if reservation else 0,
            tokens_out_reserved=reservation.tokens_out if reservation else 0,
            cost_reserved_usd=reservation.cost_usd if reservation else 0.0,
            policy_decision={
                "rule_id": self.decision.rule_id,
                "redactions": [r.rule_id for r in self.decision.redactions],
            },
            cancel_requested=False,
            pool_id=self.pool_id,
            tokens_in=0,
            tokens_out=0,
            cost_usd=0.0,
            created_at=clock.now(),
        )


def _require_ready_replica(pool: Pool, target: ReplayTarget) -> None:
    """A strict_replay step runs on its recorded replica only: refuse it, retriably, while
    that replica is not ready (as placement refuses a step when no pool is ready)."""
    replica_id = target.recorded.replica_id if target.recorded else None
    replica = pool.replica(replica_id or "")
    if replica is None or not replica.health.ready:
        raise PoolUnavailable(
            f"the recorded replica {pool.pool_id}/{replica_id} is not ready",
            details={"pool_id": pool.pool_id, "replica_id": replica_id},
            retry_after_ms=1000,
        )


async def _submit_unexecuted(tx: Tx, *, run: Run, row: _StepRow, target: ReplayTarget) -> Submitted:
    """A replay step no engine runs: served from the record, or ended with REPLAY_MISS."""
    session = tx.session
    step = row.build(position=target.position, reservation=None)
    run.step_count = target.position + 1
    run.updated_at = clock.now()
    session.add(step)
    await session.flush()
    if target.differs:
        step.replay_of = None if target.recorded is None else target.recorded.step_id
        step.replay_outcome = "miss"
        await end_unstarted(tx, step=step, status=StepStatus.FAILED, error=target.miss_error())
    else:
        assert target.recorded is not None
        await serve_recorded(tx, step=step, recorded=target.recorded)
    return Submitted(step, True, await read_ledger(session, run_id=run.run_id))


@dataclass(frozen=True)
class Submitted:
    step: Step
    created: bool
    ledger: Ledger  # the run's account after this submission


def ledger_of(run: Run) -> Ledger:
    return Ledger(
        used_in=run.tokens_in_used,
        used_out=run.tokens_out_used,
        used_cost=run.cost_used_usd,
        reserved_in=run.tokens_in_reserved,
        reserved_out=run.tokens_out_reserved,
        reserved_cost=run.cost_reserved_usd,
    )


def _is_sqlite(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "sqlite"


def enforce_logged(run_id: str, policy: RulePolicy, subject: PolicySubject) -> Decision:
    """Evaluate the policy; every decision is logged with the rule that made it."""
    decision = policy.evaluate(subject)
    policy_log.info(
        "policy %s by %s for %s",
        "allowed" if decision.allowed else "denied",
        decision.rule_id or "default",
        subject.as_dict(),
        extra={
            "run_id": run_id,
            "rule_id": decision.rule_id,
            "allowed": decision.allowed,
            "redactions": [r.rule_id for r in decision.redactions],
        },
    )
    if not decision.allowed:
        raise PolicyDenied(decision.rule_id or "", subject)
    return decision


async def _admit(
    session: AsyncSession, policy: AdmissionPolicy, priority: str, *, postgres: bool
) -> str:
    if postgres:  # one admitter per priority at a time across processes
        await _admission_lock(session, priority)
    queued = (
        await session.execute(
            sa.select(sa.func.count())
            .select_from(Step)
            .where(Step.status == StepStatus.QUEUED.value, Step.priority == priority)
        )
    ).scalar_one()
    return admit(policy, priority=priority, queued=queued)


async def _admission_lock(session: AsyncSession, priority: str) -> None:
    """Held to the end of the transaction; taking it again in the same one is a no-op wait."""
    await session.execute(
        sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": 70_000 + PRIORITY_RANK[priority]}
    )


async def _drop_oldest(tx: Tx, policy: AdmissionPolicy, priority: str) -> None:
    """Make room: the step that waited longest in this queue ends with QUEUE_FULL_DROP_LRU."""
    victim = (
        await tx.session.execute(
            sa.select(Step)
            .where(Step.status == StepStatus.QUEUED.value, Step.priority == priority)
            .order_by(Step.step_id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
    ).scalar_one_or_none()
    if victim is None:
        return
    error = dropped_error(priority, policy.capacity[priority])
    await end_unstarted(tx, step=victim, status=StepStatus.FAILED, error=error.body())


async def _by_token(session: AsyncSession, run_id: str, token: str) -> Step | None:
    return (
        await session.execute(
            sa.select(Step).where(Step.run_id == run_id, Step.client_token == token)
        )
    ).scalar_one_or_none()


def _same_request(step: Step, request_hash: str) -> Step:
    if step.request_hash != request_hash:
        raise Conflict(
            "client_token was already used in this run for a different request",
            details={"client_token": step.client_token, "step_id": step.step_id},
        )
    return step


async def get_step(session: AsyncSession, *, step_id: str, lock: bool = False) -> Step:
    stmt = sa.select(Step).where(Step.step_id == step_id)
    if lock:
        stmt = stmt.with_for_update(key_share=True)
    step = (await session.execute(stmt)).scalar_one_or_none()
    if step is None:
        raise NotFound("step", step_id)
    return step


async def list_steps(session: AsyncSession, *, run_id: str) -> list[Step]:
    rows = await session.execute(
        sa.select(Step).where(Step.run_id == run_id).order_by(Step.position)
    )
    return list(rows.scalars())


def step_view(step: Step) -> dict[str, Any]:
    status = step.status
    if status == StepStatus.RUNNING.value and step.cancel_requested:
        status = "cancelling"
    return {
        **{
            c: getattr(step, c)
            for c in (
                "step_id",
                "run_id",
                "position",
                "type",
                "client_token",
                "cancel_requested",
                "input",
                "budgets",
                "placement",
                "pool_id",
                "replica_id",
                "output",
                "provenance",
                "error",
                "replay_of",
                "replay_outcome",
                "created_at",
                "started_at",
                "ended_at",
            )
        },
        "status": status,
        "priority": step.priority,
        "usage": {
            "tokens_in": step.tokens_in,
            "tokens_out": step.tokens_out,
            "cost_usd": step.cost_usd,
        },
        "reserved": {
            "tokens_in": step.tokens_in_reserved,
            "tokens_out": step.tokens_out_reserved,
            "cost_usd": step.cost_reserved_usd,
        },
        "max_tokens_granted": step.max_tokens_granted,
        "budget_clamped": step.budget_clamped,
        "policy_decision": step.policy_decision,
    }


async def end_unstarted(
    tx: Tx, *, step: Step, status: StepStatus, error: dict[str, Any] | None = None
) -> None:
    """End a step that never started: ``started`` then ``end{cancelled}`` or ``error``.

    Its reservation goes back to the run.
    """
    check_step_transition(StepStatus(step.status), status)
    step.status = status.value
    step.ended_at = clock.now()
    if step.replay_of is not None and step.replay_outcome is None:
        step.replay_outcome = "cancelled" if status is StepStatus.CANCELLED else "failed"
    step.output = {
        "text": "",
        "token_ids": [],
        "stop_reason": "cancelled" if error is None else None,
    }
    step.error = error
    order = EventOrder()
    started = make_event(
        step.run_id,
        step.step_id,
        order.accept(EventType.STARTED),
        "started",
        {"pool_id": step.pool_id, "replica_id": None, "engine": None},
    )
    if error is None:
        last = make_event(
            step.run_id,
            step.step_id,
            order.accept(EventType.END),
            "end",
            {"stop_reason": "cancelled", "tokens_in": 0, "tokens_out": 0, "provenance": None},
        )
    else:
        last = make_event(
            step.run_id,
            step.step_id,
            order.accept(EventType.ERROR),
            "error",
            {**error, "correlation_id": None},
        )
    await tx.append_events([started, last])
    await settle(tx.session, step=step, tokens_in=0, tokens_out=0, cost_usd=0.0)
    await settle_run_after_step(tx.session, run_id=step.run_id)


async def cancel_step(tx: Tx, *, step_id: str) -> tuple[str, bool]:
    """Returns (status to report, whether a running execution must be told)."""
    step = await get_step(tx.session, step_id=step_id, lock=True)
    status = StepStatus(step.status)
    if status.terminal:
        return step.status, False
    if status is StepStatus.QUEUED:
        await end_unstarted(tx, step=step, status=StepStatus.CANCELLED)
        return step.status, False
    step.cancel_requested = True
    return "cancelling", True


async def claim_queued(
    session: AsyncSession, *, pool_id: str, limit: int, full_replicas: Sequence[str] = ()
) -> list[tuple[Step, Run]]:
    """Lock up to ``limit`` queued steps of a pool: interactive before batch, FIFO within
    a priority (SKIP LOCKED on PostgreSQL, so processes never claim the same step).

    Steps pinned to a replica in ``full_replicas`` (strict_replay) are passed over, so they
    wait for their replica without holding back steps that can run elsewhere."""
    where = [Step.status == StepStatus.QUEUED.value, Step.pool_id == pool_id]
    if full_replicas:
        where.append(sa.or_(Step.replay_of.is_(None), Step.replica_id.not_in(list(full_replicas))))
    rows = (
        await session.execute(
            sa.select(Step, Run)
            .join(Run, Run.run_id == Step.run_id)
            .where(*where)
            .order_by(Step.priority_rank, Step.step_id)
            .limit(limit)
            .with_for_update(of=Step, skip_locked=True)
        )
    ).all()
    return [(step, run) for step, run in rows]


async def mark_running(session: AsyncSession, *, step_id: str, replica_id: str) -> None:
    await session.execute(
        sa.update(Step)
        .where(Step.step_id == step_id, Step.status == StepStatus.QUEUED.value)
        .values(status=StepStatus.RUNNING.value, replica_id=replica_id, started_at=clock.now())
    )


async def queued_counts(session: AsyncSession) -> dict[str, int]:
    rows = (
        await session.execute(
            sa.select(Step.pool_id, sa.func.count())
            .where(Step.status == StepStatus.QUEUED.value)
            .group_by(Step.pool_id)
        )
    ).all()
    return {str(pool): int(n) for pool, n in rows}


async def cancel_requested_among(session: AsyncSession, *, step_ids: list[str]) -> list[str]:
    if not step_ids:
        return []
    rows = await session.execute(
        sa.select(Step.step_id).where(Step.step_id.in_(step_ids), Step.cancel_requested.is_(True))
    )
    return list(rows.scalars())


async def settle_run_after_step(session: AsyncSession, *, run_id: str) -> None:
    """A cancelling run becomes cancelled when its last live step has ended."""
    run = (
        await session.execute(
            sa.select(Run).where(Run.run_id == run_id).with_for_update(key_share=True)
        )
    ).scalar_one()
    if run.status != RunStatus.CANCELLING.value:
        return
    live = (
        await session.execute(
            sa.select(sa.func.count())
            .select_from(Step)
            .where(
                Step.run_id == run_id,
                Step.status.in_([StepStatus.QUEUED.value, StepStatus.RUNNING.value]),
            )
        )
    ).scalar_one()
    if live == 0:
        run.status = RunStatus.CANCELLED.value
        run.updated_at = clock.now()


async def end_interrupted(tx: Tx, *, step: Step, message: str) -> None:
    """End a running step whose execution is gone: an ``error`` event after what its log
    holds (``started`` first if it has nothing), usage = the tokens it committed."""
    session = tx.session
    last, tokens = (
        await session.execute(
            sa.select(
                sa.func.max(Event.seq),
                sa.func.count().filter(Event.type == EventType.TOKEN.value),
            ).where(Event.step_id == step.step_id)
        )
    ).one()
    events = []
    seq = 0 if last is None else last + 1
    if last is None:
        events.append(
            make_event(
                step.run_id,
                step.step_id,
                0,
                EventType.STARTED.value,
                {"pool_id": step.pool_id, "replica_id": step.replica_id, "engine": None},
            )
        )
        seq = 1
    body = {
        "code": "INTERNAL",
        "message": message,
        "retriable": True,
        "retry_after_ms": None,
        "details": {"tokens_out": tokens},
        "correlation_id": None,
    }
    events.append(make_event(step.run_id, step.step_id, seq, EventType.ERROR.value, body))
    await tx.append_events(events)
    step.status = StepStatus.FAILED.value
    step.error = body
    step.ended_at = clock.now()
    step.tokens_out = tokens
    await settle(session, step=step, tokens_in=0, tokens_out=tokens, cost_usd=0.0)
    await settle_run_after_step(session, run_id=step.run_id)
