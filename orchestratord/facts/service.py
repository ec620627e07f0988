"""Facts (append-only, typed, optionally schema-checked) and checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.events import FactEvent
from contracts.records import CheckpointCreate, FactCreate
from orchestrator_core import clock
from orchestrator_core.canonical import normalize, sha256_of
from orchestrator_core.errors import InvalidParams, NotFound
from orchestrator_core.lifecycle import RunStatus, check_run_accepts_steps
from orchestrator_core.policy import PolicySubject, redact_json
from orchestrator_core.regexes import Regex
from orchestrator_core.schemas.cost import checked, regex_steps
from orchestrator_core.schemas.instance import check_data, within_regex_bound
from orchestratord.db.models import Checkpoint, Fact, Flow, Run, Step
from orchestratord.eventlog import log_event
from orchestratord.flows.service import get_flow
from orchestratord.idempotency import Token
from orchestratord.policies import policy_of
from orchestratord.runs.ledger import usage_of
from orchestratord.runs.service import get_run
from orchestratord.tx import Tx


async def emit_fact(tx: Tx, *, run_id: str, body: FactCreate) -> Fact:
    """Append a fact and its ``fact`` event on the run stream.

    When the run's flow declares ``config.fact_schemas[type]``, ``data`` must match it.
    """
    session = tx.session
    run = await get_run(session, run_id=run_id)
    check_run_accepts_steps(RunStatus(run.status), "facts")
    flow = await session.get(Flow, run.flow_id)
    schema = (flow.config.get("fact_schemas") or {}).get(body.type) if flow else None
    data = normalize(body.data, "data")
    decision = policy_of(run).evaluate(PolicySubject(step_type="fact"))
    data = _redacted_and_checked(data, decision.patterns, schema)
    if body.step_id is not None:
        step = await session.get(Step, body.step_id)
        if step is None or step.run_id != run_id:
            raise InvalidParams("no step with this id in the run", field="step_id")
    fact = Fact(
        fact_id=clock.new_id("fact"),
        run_id=run_id,
        type=body.type,
        schema_uri=body.schema_uri,
        data=data,
        emitted_by_step=body.step_id,
        created_at=clock.now(),
    )
    if (token := Token.of(body)) is not None:
        token.stamp(fact)
    session.add(fact)
    await session.flush()
    await tx.append_events(
        [
            log_event(
                run_id,
                None,
                None,
                FactEvent(
                    fact_id=fact.fact_id,
                    fact_type=fact.type,
                    data=data,
                    schema_uri=fact.schema_uri,
                    emitted_by_step=fact.emitted_by_step,
                ),
            )
        ]
    )
    return fact


def _redacted_and_checked(data: Any, patterns: Sequence[Regex], schema: Any) -> Any:
    """The data as stored: redacted (facts are stored and streamed redacted), then checked
    against the fact type's schema, if any. Both are bounded, and run off the event loop
    when costly and the caller offloads (``Validation.offloading``)."""
    if not patterns and schema is None:
        return data

    def check() -> Any:
        within_regex_bound(data, patterns, field="data")
        redacted = redact_json(data, patterns) if patterns else data
        if schema is not None:
            check_data(schema, redacted, field="data")
        return redacted

    kind = b"fact:" + "\0".join(p.pattern for p in patterns).encode()
    return checked(
        kind,
        schema if schema is not None else True,
        data,
        check,
        extra_steps=regex_steps(patterns),
    )


async def list_facts(
    session: AsyncSession, *, run_id: str, fact_type: str | None, after: str | None, limit: int
) -> Sequence[Fact]:
    await get_run(session, run_id=run_id)
    return await _page(session, Fact.run_id == run_id, "run", fact_type, after, limit)


async def list_flow_facts(
    session: AsyncSession, *, flow_id: str, fact_type: str | None, after: str | None, limit: int
) -> Sequence[Fact]:
    """The facts of every run of a flow, in append order."""
    await get_flow(session, flow_id=flow_id)
    runs = sa.select(Run.run_id).where(Run.flow_id == flow_id).scalar_subquery()
    return await _page(session, Fact.run_id.in_(runs), "flow", fact_type, after, limit)


async def _page(
    session: AsyncSession,
    scope: Any,
    scope_name: str,
    fact_type: str | None,
    after: str | None,
    limit: int,
) -> Sequence[Fact]:
    stmt = sa.select(Fact).where(scope)
    if fact_type is not None:
        stmt = stmt.where(Fact.type == fact_type)
    if after is not None:
        anchor = (
            await session.execute(sa.select(Fact.id).where(Fact.fact_id == after, scope))
        ).scalar_one_or_none()
        if anchor is None:
            raise InvalidParams(f"no fact with this id in the {scope_name}", field="query.after")
        stmt = stmt.where(Fact.id > anchor)
    return (await session.execute(stmt.order_by(Fact.id).limit(limit))).scalars().all()


async def create_checkpoint(
    session: AsyncSession, *, run_id: str, body: CheckpointCreate
) -> Checkpoint:
    run = await get_run(session, run_id=run_id)
    if body.step_id is not None:
        step = await session.get(Step, body.step_id)
        if step is None or step.run_id != run_id:
            raise InvalidParams("no step with this id in the run", field="step_id")
    state = normalize(body.state, "state")
    cursors = await cursors_in(session, run, position=None)
    cp = Checkpoint(
        checkpoint_id=clock.new_id("ckpt"),
        run_id=run_id,
        step_id=body.step_id,
        state=state,
        state_hash=sha256_of(state),
        cursors=cursors,
        created_at=clock.now(),
    )
    if (token := Token.of(body)) is not None:
        token.stamp(cp)
    session.add(cp)
    await session.flush()
    return cp


async def list_checkpoints(session: AsyncSession, *, run_id: str) -> Sequence[Checkpoint]:
    if await session.get(Run, run_id) is None:
        raise NotFound("run", run_id)
    return (
        (
            await session.execute(
                sa.select(Checkpoint)
                .where(Checkpoint.run_id == run_id)
                .order_by(Checkpoint.checkpoint_id)
            )
        )
        .scalars()
        .all()
    )


async def cursors_in(session: AsyncSession, run: Run, *, position: int | None) -> dict[str, Any]:
    """Where the run stands: its last fact, the last step position (``position``, else the
    last step submitted), its budget usage."""
    last_fact = (
        await session.execute(
            sa.select(Fact.fact_id)
            .where(Fact.run_id == run.run_id)
            .order_by(Fact.id.desc())
            .limit(1)
        )
    ).scalar_one_or_none()
    return {
        "last_fact_id": last_fact,
        "last_step_position": run.step_count - 1 if position is None else position,
        "usage": usage_of(run),
    }
