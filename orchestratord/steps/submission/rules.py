"""The submission's rules before the insert, in order (``RULES`` in ``pipeline.py``).

Each reads what the rules before it resolved and either goes on (returns ``None``), answers
(returns ``Submitted``: a repeated request, a replay step served from its record), or
refuses by raising a domain error that the HTTP layer maps (422, 403, 409, 429, 503...).
They never ask which kind of step they hold: they call the kind's protocol
(``steps/kinds``).
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import placement_to_json
from orchestrator_core import clock
from orchestrator_core.admission import PRIORITY_RANK, admit
from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import InvalidParams, NotFound, PoolUnavailable, TooLarge
from orchestrator_core.lifecycle import RunStatus, StepStatus, check_run_accepts_steps
from orchestrator_core.placement import Needs, Placed, decide, placement_rule
from orchestrator_core.policy import Decision, PolicyDenied, PolicySubject, redact_json
from orchestratord import tracing
from orchestratord.db.models import Flow, Run
from orchestratord.db.prepared import detached
from orchestratord.metrics import Metrics
from orchestratord.policies import policy_of
from orchestratord.pools.registry import Pool
from orchestratord.replay.steps import ReplayTarget, lock_run, replay_target, serve_recorded
from orchestratord.runs.ledger import read_ledger
from orchestratord.steps.kinds import kind_of
from orchestratord.steps.queries import by_token
from orchestratord.steps.submission import fast_path
from orchestratord.steps.submission.context import (
    ReadAgain,
    Slot,
    Submission,
    Submitted,
    build_step,
)
from orchestratord.steps.submission.statements import (
    AHEAD_IN_POOL,
    QUEUED_AT_PRIORITY,
    RUN_AND_TOKEN,
    RUN_COLUMNS,
)
from orchestratord.steps.transition import end_unstarted

policy_log = logging.getLogger("orchestratord.policy")


class LoadRun:
    """The run exists; a repeated ``client_token`` answers with the first step; the run
    still takes steps. A kept run is not read: ``Insert``'s one statement checks all three."""

    async def apply(self, sub: Submission) -> Submitted | None:
        body = sub.body
        sub.request_hash = sha256_of(
            {
                **body.model_dump(mode="json", exclude={"client_token", "input"}),
                "input": body.input.model_dump(mode="json", exclude_unset=True),
            }
        )
        if sub.kept is not None:  # a running record run: the statement storing the step checks
            sub.run = detached(Run, sub.kept)
            return None
        params = {"run_id": sub.run_id, "token": body.client_token}
        found = await RUN_AND_TOKEN.first(sub.db, params)
        if found is None:
            sub.ctx.runs.drop(sub.run_id)
            raise NotFound("run", sub.run_id)
        values = dict(zip(RUN_COLUMNS, found, strict=False))
        sub.run = detached(Run, values)
        if not sub.sqlite:  # where a read is a round trip
            sub.ctx.runs.keep(sub.run_id, values)
        repeated = found[-1]
        if repeated is not None:
            existing = await by_token(sub.session, sub.run_id, body.client_token)
            assert existing is not None  # steps are never deleted
            return sub.repeat(existing)
        check_run_accepts_steps(RunStatus(sub.run.status))
        return None


class ResolveKind:
    """The kind that serves the type (501 when none does), and the input it stores."""

    async def apply(self, sub: Submission) -> Submitted | None:
        sub.kind = kind = kind_of(sub.body.type)
        assert isinstance(sub.body.input, kind.input_model)  # the union and the registry agree
        flow = await sub.session.get(Flow, sub.run.flow_id) if kind.uses_flow else None
        assert flow is not None or not kind.uses_flow  # runs reference their flow
        sub.stored = kind.normalize(sub.body.input, flow=flow, field="input")
        sub.placement = placement_to_json(sub.body.placement)
        return None


class Place:
    """Record runs: engine kinds go to a pool (placement, else the run's pool policy).
    Replay runs: the step takes the next position under the run's lock, matched with the
    recorded step there; it goes where that step ran."""

    async def apply(self, sub: Submission) -> Submitted | None:
        with tracing.span("step.place", run_id=sub.run_id, kind=sub.body.type) as span:
            answer = await self._place(sub)
            tracing.annotate(span, pool=sub.pool_id)
        return answer

    async def _place(self, sub: Submission) -> Submitted | None:
        run = sub.run
        if run.mode == "record":
            if sub.kind.engine:
                effective = sub.placement if sub.placement is not None else run.pool_policy
                field = "placement" if sub.placement else "pool_policy"
                sub.placed = _placed(sub, effective, field=field)
                sub.pool_id = sub.placed.pool_id
            return None
        if run.mode == "strict_replay" and not sub.sqlite:
            # it may go through admission: take that lock first, as record submissions do
            await admission_lock(sub.session, sub.body.priority)
        sub.run = run = await lock_run(sub.session, sub.run_id)
        existing = await by_token(sub.session, sub.run_id, sub.body.client_token)
        if existing is not None:  # raced the lock
            return sub.repeat(existing)
        check_run_accepts_steps(RunStatus(run.status))  # it may have been cancelled meanwhile
        sub.target = await replay_target(sub.session, run)
        sub.pool_id = sub.target.pool_id
        if sub.pool_id is not None:  # where the recorded step ran
            sub.placed = Placed("replay", sub.pool_id)
        return None


def _placed(sub: Submission, placement: Any, *, field: str) -> Placed:
    """``decide``; a refusal counted here (from a kept run, the fresh read that follows
    counts it), a placement once the step is stored (``record_placement``)."""
    try:
        placed = decide(
            placement,
            sub.ctx.pools.views(),
            field=field,
            needs=Needs.of(sub.kind.llm_input(sub.stored), seeded=bool(sub.run.seed_given)),
        )
    except (PoolUnavailable, InvalidParams) as exc:
        if sub.kept is None:
            outcome = "unavailable" if isinstance(exc, PoolUnavailable) else "refused"
            sub.ctx.metrics.placement_decisions.labels(placement_rule(placement), outcome).inc()
        raise
    if sub.kept is None:
        record_placement(sub.ctx.metrics, placed)
    return placed


def record_placement(metrics: Metrics, placed: Placed) -> None:
    """A placement by rule, and the replicas it passed over by cause."""
    metrics.placement_decisions.labels(placed.rule, "placed").inc()
    for candidate in placed.candidates:
        if candidate.cause is not None:
            metrics.placement_passed_over.labels(candidate.cause).inc()


class Police:
    """The run's policy decides (403 naming the rule); redact rules mask the stored input."""

    async def apply(self, sub: Submission) -> Submitted | None:
        pool = sub.ctx.pools.get(sub.pool_id) if sub.pool_id is not None else None
        target = sub.target
        model = sub.kind.model(sub.stored) or (
            pool.model_name if pool is not None else target.model if target is not None else None
        )
        subject = sub.kind.subject(sub.stored, model=model, pool=sub.pool_id)
        sub.decision = decision = policy_of(sub.run).evaluate(subject)
        if sub.kept is None:
            record_decision(sub.ctx.metrics, sub.run_id, subject, decision)
        else:  # recorded once, by the attempt that answers (a kept run's may read again)
            sub.subject = subject
        if not decision.allowed:
            raise PolicyDenied(decision.rule_id or "", subject)
        if decision.patterns:
            sub.stored = redact_json(sub.stored, sub.decision.patterns)
        sub.llm = sub.kind.llm_input(sub.stored)
        return None


class BoundPrompt:
    """A prompt (or the messages together) is at most ``limits.max_prompt_chars`` long."""

    async def apply(self, sub: Submission) -> Submitted | None:
        llm, limit = sub.llm, sub.ctx.max_prompt_chars
        if llm is None:
            return None
        if llm.messages is not None:
            size, field_name = sum(len(m.content) for m in llm.messages), "input.messages"
        else:
            size, field_name = len(llm.prompt or ""), "input.prompt"
        if size > limit:
            raise TooLarge(
                f"a prompt is at most {limit} characters, not {size}",
                limit="limits.max_prompt_chars",
                value=limit,
                field=field_name,
            )
        return None


class MatchRecord:
    """Replay runs: a step no engine runs again is served from the record, or ends with
    ``REPLAY_MISS`` naming every input that differs."""

    async def apply(self, sub: Submission) -> Submitted | None:
        target = sub.target
        if target is None:
            return None
        recorded = target.recorded
        recorded_key = (
            None
            if recorded is None
            else kind_of(recorded.type).replay_key(
                recorded.input, int((recorded.provenance or {}).get("seed", target.source_seed))
            )
        )
        target.compare(sub.kind.replay_key(sub.stored, sub.run.seed), recorded_key)
        if target.executes(sub.run.mode, sub.ctx.pools, engine=sub.kind.engine):
            return None
        return await _submit_unexecuted(sub, target)


class Quote:
    """Engine kinds: the price of the model on its pool (the pool's own, else the run's price
    table; a model with neither runs unpriced, and is refused under a cost budget: the
    step's budgets decide, ``budgets.StepBudget``), and the prompt's tokens by the engine's
    tokenizer. A strict_replay step needs its recorded replica ready."""

    async def apply(self, sub: Submission) -> Submitted | None:
        if not sub.kind.engine:
            return None
        assert sub.pool_id is not None and sub.llm is not None
        pool = sub.ctx.pools.require(sub.pool_id)
        if sub.target is not None:
            _require_ready_replica(pool, sub.target)
        model = sub.kind.model(sub.stored) or pool.model_name
        table = sub.run.price_table
        sub.price = sub.ctx.prices.resolve(table, engine=pool.engine, model=model, own=pool.price)
        sub.budget.require_price(sub.price, engine=pool.engine, model=model, price_table=table)
        sub.tokens_in = pool.count_prompt_tokens(sub.llm)
        return None


class StartNow:
    """Record runs: an engine step starts in its submission's transaction when its pool has a
    free slot (its session's replica's, where the engine keeps sessions) and no step of its
    priority or higher waits in that pool's queue (the queue's order holds). It takes the
    slot here; the slot goes back if the submission does not commit. Where the step will be
    stored by one statement (``fast_path``), that statement checks the queue and, on
    PostgreSQL, that the replica's slot is free in every process: no round trip of its own
    (``pools/slots.py``)."""

    async def apply(self, sub: Submission) -> Submitted | None:
        starter = sub.ctx.starter
        if starter is None or not sub.kind.engine or sub.target is not None:
            return None
        if sub.pool_id is None or not starter.may_start():
            return None
        pool = sub.ctx.pools.require(sub.pool_id)
        if pool.free_slots <= 0:
            return None
        if fast_path.applies(sub):
            sub.queue_unchecked = True  # and the replica's slot, across processes
        else:
            params = {"pool_id": pool.pool_id, "rank": PRIORITY_RANK[sub.body.priority]}
            if (await AHEAD_IN_POOL.rows(sub.db, params))[0][0]:
                return None
            if not sub.sqlite:  # the slots other processes hold
                await starter.look(sub.session, pool)
        replica = starter.slot_for(pool, sub.run)  # taken meanwhile, or its session's is busy
        if replica is not None:
            sub.slot = slot = Slot(starter, pool, replica)
            sub.tx.on_rollback(slot.release)
        return None


class Admit:
    """Engine kinds wait in a bounded queue per priority (429, or drop the oldest). A step
    that took a free slot never waits: it is not counted, and takes no admission lock."""

    async def apply(self, sub: Submission) -> Submitted | None:
        if not sub.kind.engine or sub.slot is not None:
            return None
        if sub.kept is not None:  # the queue's lock begins a transaction: the run is read
            raise ReadAgain
        priority = sub.body.priority
        if not sub.sqlite:  # one admitter per priority at a time across processes
            await admission_lock(sub.session, priority)
        queued = (await QUEUED_AT_PRIORITY.rows(sub.db, {"priority": priority}))[0][0]
        sub.verdict = admit(sub.ctx.admission, priority=priority, queued=queued)
        return None


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


async def _submit_unexecuted(sub: Submission, target: ReplayTarget) -> Submitted:
    """A replay step nothing runs again: served from the record, or ended with REPLAY_MISS."""
    session, run = sub.session, sub.run
    step = build_step(sub, position=target.position, reservation=None)
    run.step_count = target.position + 1
    run.updated_at = clock.now()
    session.add(step)
    await session.flush()
    if target.differs:
        step.replay_of = None if target.recorded is None else target.recorded.step_id
        step.replay_outcome = "miss"
        await end_unstarted(sub.tx, step=step, status=StepStatus.FAILED, error=target.miss_error())
    else:
        assert target.recorded is not None
        await serve_recorded(sub.tx, step=step, recorded=target.recorded)
    return Submitted(step, True, await read_ledger(session, run_id=run.run_id), run)


def record_decision(
    metrics: Metrics, run_id: str, subject: PolicySubject, decision: Decision
) -> None:
    """Count a policy decision and log it with the rule that made it (every one, once)."""
    metrics.policy.labels("allowed" if decision.allowed else "denied").inc()
    if policy_log.isEnabledFor(logging.INFO):  # the subject's dict only for a record kept
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


async def admission_lock(session: AsyncSession, priority: str) -> None:
    """Held to the end of the transaction; taking it again in the same one is a no-op wait."""
    await session.execute(
        sa.select(sa.func.pg_advisory_xact_lock(70_000 + PRIORITY_RANK[priority]))
    )
