"""Steps of replay runs: find the recorded step, serve it from the log, or report a miss.

A step submitted to a ``replay`` or ``strict_replay`` run is matched with the step of the
source run at the same position. ``replay`` copies the recorded events (re-keyed to the new
step) and the recorded output, without an engine; ``strict_replay`` runs the step again on
the recorded replica and compares the stream (see ``execution``). A step without an equal
recorded counterpart ends with ``REPLAY_MISS`` naming each input that differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from orchestrator_core.errors import NotFound
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.replay import (
    RecordedStream,
    ReplayMiss,
    StepKey,
    recorded_stream,
    step_differences,
)
from orchestratord.db.engine import Database
from orchestratord.db.models import Fact, Run, Step
from orchestratord.eventlog import LogEvent, read_all_step_events
from orchestratord.facts.rows import fact_row
from orchestratord.pools.registry import PoolRegistry
from orchestratord.runs.ledger import settle
from orchestratord.steps.transition import transition
from orchestratord.tx import Tx


async def lock_run(session: AsyncSession, run_id: str) -> Run:
    """Lock a replay run's row: its submissions are serialized, so the position a step will
    take (``step_count``) is known before it is inserted."""
    run = (
        await session.execute(
            sa.select(Run)
            .where(Run.run_id == run_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
    if run is None:
        raise NotFound("run", run_id)
    return run


async def recorded_at(session: AsyncSession, source_run_id: str, position: int) -> Step | None:
    return (
        await session.execute(
            sa.select(Step).where(Step.run_id == source_run_id, Step.position == position)
        )
    ).scalar_one_or_none()


def differences(
    recorded: Step | None, recorded_key: StepKey | None, submitted: StepKey, position: int
) -> list[dict[str, Any]]:
    """Why ``submitted`` cannot reproduce ``recorded``; empty when it can."""
    if recorded is None or recorded_key is None:
        return [{"input": "position", "recorded": None, "submitted": position}]
    if not StepStatus(recorded.status).terminal:
        return [{"input": "recorded_status", "recorded": recorded.status, "submitted": None}]
    return step_differences(recorded_key, submitted)


def miss_error(
    *, position: int, source_run_id: str, recorded: Step | None, differs: list[dict[str, Any]]
) -> dict[str, Any]:
    names = ", ".join(d["input"] for d in differs)
    if recorded is None:
        message = f"the source run has no step at position {position}"
    else:
        message = f"the step differs from the recorded step at position {position} in: {names}"
    return ReplayMiss(
        message,
        details={
            "position": position,
            "source_run_id": source_run_id,
            "recorded_step_id": None if recorded is None else recorded.step_id,
            "differs": [d["input"] for d in differs],
            "inputs": differs,
        },
    ).body()


async def _recorded_events(session: AsyncSession, step_id: str) -> list[tuple[str, bytes]]:
    return [(ev.type, ev.data) for ev in await read_all_step_events(session, step_id)]


async def serve_recorded(tx: Tx, *, step: Step, recorded: Step) -> None:
    """End ``step`` as ``recorded`` ended, from the log: same events, output and provenance.

    No engine is involved, so nothing is charged; the run's usage counts the tokens served.
    """
    events: list[LogEvent] = []
    for etype, data in await _recorded_events(tx.session, recorded.step_id):
        body = orjson.loads(data)
        body["step_id"] = step.step_id
        if etype in ("end", "error") and isinstance(body.get("provenance"), dict):
            body["provenance"] = {**body["provenance"], "replayed_from": recorded.step_id}
        events.append(LogEvent(step.run_id, step.step_id, body["seq"], etype, orjson.dumps(body)))
    await tx.append_events(events)
    await _copy_facts(tx.session, step=step, recorded=recorded)
    provenance = recorded.provenance
    transition(step, StepStatus.RUNNING)
    transition(step, StepStatus(recorded.status))
    step.pool_id = recorded.pool_id
    step.replica_id = recorded.replica_id
    step.output = recorded.output
    step.error = recorded.error
    step.tokens_in = recorded.tokens_in
    step.tokens_out = recorded.tokens_out
    step.provenance = (
        None if provenance is None else {**provenance, "replayed_from": recorded.step_id}
    )
    step.replay_of = recorded.step_id
    step.replay_outcome = "identical"
    await settle(
        tx.session,
        step=step,
        tokens_in=recorded.tokens_in,
        tokens_out=recorded.tokens_out,
        cost_usd=0.0,
    )


async def _copy_facts(session: AsyncSession, *, step: Step, recorded: Step) -> None:
    """The facts the recorded step appended (a tool's result) belong to the replay too."""
    rows = (
        await session.execute(
            sa.select(Fact).where(Fact.emitted_by_step == recorded.step_id).order_by(Fact.id)
        )
    ).scalars()
    for fact in rows.all():
        session.add(
            fact_row(
                run_id=step.run_id,
                type=fact.type,
                data=fact.data,
                emitted_by_step=step.step_id,
                schema_uri=fact.schema_uri,
            )
        )


async def load_recorded_stream(db: Database, step_id: str) -> RecordedStream:
    async with db.read() as session:
        rows = await _recorded_events(session, step_id)
    return recorded_stream([orjson.loads(data) for _, data in rows])


@dataclass
class ReplayTarget:
    """The recorded step a submission to a replay run must reproduce."""

    position: int
    source_run_id: str
    source_seed: int
    recorded: Step | None
    differs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pool_id(self) -> str | None:
        return None if self.recorded is None else self.recorded.pool_id

    @property
    def model(self) -> str | None:
        """The model the recorded step ran (policy rules may match it; its pool may be gone)."""
        if self.recorded is None:
            return None
        return self.recorded.input.get("model") or (self.recorded.provenance or {}).get("model")

    def compare(self, submitted: StepKey, recorded_key: StepKey | None) -> None:
        self.differs = differences(self.recorded, recorded_key, submitted, self.position)

    def executes(self, mode: str, pools: PoolRegistry, *, engine: bool) -> bool:
        """Whether an engine runs the step again (strict_replay of an engine kind's step
        that reached one); otherwise it is served from the record, or ends as a miss: a
        tool is never called again, a file never touched again."""
        rec = self.recorded
        if self.differs or mode != "strict_replay" or rec is None or rec.replica_id is None:
            return False
        if not engine:
            return False
        pool = pools.get(rec.pool_id or "")
        if pool is None or pool.replica(rec.replica_id) is None:
            self.differs = [
                {
                    "input": "replica",
                    "recorded": {"pool_id": rec.pool_id, "replica_id": rec.replica_id},
                    "submitted": None,
                }
            ]
            return False
        return True

    def miss_error(self) -> dict[str, Any]:
        return miss_error(
            position=self.position,
            source_run_id=self.source_run_id,
            recorded=self.recorded,
            differs=self.differs,
        )


async def replay_target(session: AsyncSession, run: Run) -> ReplayTarget:
    assert run.source_run_id is not None
    source = await session.get(Run, run.source_run_id)
    if source is None:
        raise NotFound("run", run.source_run_id)
    return ReplayTarget(
        position=run.step_count,
        source_run_id=source.run_id,
        source_seed=source.seed,
        recorded=await recorded_at(session, source.run_id, run.step_count),
    )
