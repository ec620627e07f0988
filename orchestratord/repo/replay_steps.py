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

from orchestrator_core import clock
from orchestrator_core.errors import NotFound
from orchestrator_core.generation import LlmInput, llm_input_of
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.replay import (
    RecordedStream,
    ReplayMiss,
    StepKey,
    recorded_stream,
    step_differences,
)
from orchestratord.db.engine import Database
from orchestratord.db.models import Event, Run, Step
from orchestratord.eventlog import LogEvent
from orchestratord.pools import PoolRegistry
from orchestratord.repo.budgets import settle
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


def key_of(step_type: str, llm: LlmInput, seed: int) -> StepKey:
    return StepKey(
        type=step_type,
        prompt_hash=llm.prompt_hash,
        params_hash=llm.params_hash,
        model=llm.model,
        seed=seed,
    )


def recorded_key(recorded: Step, source_seed: int) -> StepKey:
    seed = (recorded.provenance or {}).get("seed", source_seed)
    return key_of(recorded.type, llm_input_of(recorded.input), int(seed))


def differences(
    recorded: Step | None, source_seed: int, submitted: StepKey, position: int
) -> list[dict[str, Any]]:
    """Why ``submitted`` cannot reproduce ``recorded``; empty when it can."""
    if recorded is None:
        return [{"input": "position", "recorded": None, "submitted": position}]
    if not StepStatus(recorded.status).terminal:
        return [{"input": "recorded_status", "recorded": recorded.status, "submitted": None}]
    return step_differences(recorded_key(recorded, source_seed), submitted)


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


async def _recorded_events(session: AsyncSession, step_id: str) -> list[tuple[str, str]]:
    rows = await session.execute(
        sa.select(Event.type, Event.data).where(Event.step_id == step_id).order_by(Event.seq)
    )
    return [(t, d) for t, d in rows.all()]


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
    provenance = recorded.provenance
    step.status = recorded.status
    step.pool_id = recorded.pool_id
    step.replica_id = recorded.replica_id
    step.started_at = step.ended_at = clock.now()
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

    def compare(self, submitted: StepKey) -> None:
        self.differs = differences(self.recorded, self.source_seed, submitted, self.position)

    def executes(self, mode: str, pools: PoolRegistry) -> bool:
        """Whether an engine runs the step again (strict_replay of a step that reached one);
        otherwise it is served from the record, or ends as a miss."""
        rec = self.recorded
        if self.differs or mode != "strict_replay" or rec is None or rec.replica_id is None:
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
