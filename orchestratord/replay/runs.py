"""Replay runs: what they inherit from the recorded run, the strict_replay gate, the report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import placement_to_json
from contracts.runs import RunCreate
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.placement import PoolView
from orchestrator_core.replay import (
    EngineIdentity,
    RecordedReplica,
    RecordedSample,
    StrictReplayMismatch,
    run_mismatches,
    seedless_mismatches,
)
from orchestratord.db.models import Run, Step


@dataclass(frozen=True)
class ReplaySettings:
    seed: int
    budgets: dict[str, Any]
    policy: dict[str, Any]
    pool_policy: Any
    fs_policy: dict[str, Any]
    price_table: str


def inherited(body: RunCreate, source: Run) -> ReplaySettings:
    """A replay run takes the recorded run's seed, budgets, policy, placement, fs policy and
    price table, except what the request sets explicitly."""
    given = body.model_fields_set
    return ReplaySettings(
        seed=body.seed if body.seed is not None else source.seed,
        budgets=body.budgets.model_dump() if "budgets" in given else source.budgets,
        policy=body.policy.model_dump(exclude_none=True) if "policy" in given else source.policy,
        pool_policy=(
            placement_to_json(body.pool_policy) if "pool_policy" in given else source.pool_policy
        ),
        fs_policy=body.fs_policy.model_dump() if "fs_policy" in given else source.fs_policy,
        price_table=source.price_table,
    )


async def recorded_replicas(session: AsyncSession, source_run_id: str) -> list[RecordedReplica]:
    """The replicas the recorded run's steps ran on, with the engine identity they reported."""
    rows = await session.execute(
        sa.select(Step.pool_id, Step.replica_id, Step.provenance).where(
            Step.run_id == source_run_id, Step.replica_id.is_not(None)
        )
    )
    seen: dict[tuple[str, str], RecordedReplica] = {}
    for pool_id, replica_id, provenance in rows.all():
        if pool_id is None or replica_id is None or not provenance:
            continue  # never produced an end: nothing to compare with
        seen.setdefault(
            (pool_id, replica_id),
            RecordedReplica(
                pool_id=pool_id,
                replica_id=replica_id,
                identity=EngineIdentity(
                    engine=provenance.get("engine"),
                    engine_version=provenance.get("engine_version"),
                    model_hash=provenance.get("model_hash"),
                ),
            ),
        )
    return list(seen.values())


async def recorded_samples(session: AsyncSession, source_run_id: str) -> list[RecordedSample]:
    """The recorded run's engine steps that ran on a replica and sampled (temperature above
    0), in their order: the steps a strict_replay runs again whose tokens depend on the seed."""
    # (imported here: the kinds import the facts service, which imports the runs service,
    # which imports this module)
    from orchestratord.steps.kinds import KINDS

    rows = await session.execute(
        sa.select(Step.step_id, Step.type, Step.input, Step.pool_id, Step.replica_id)
        .where(Step.run_id == source_run_id, Step.replica_id.is_not(None))
        .order_by(Step.position)
    )
    out: list[RecordedSample] = []
    for step_id, type_, stored, pool_id, replica_id in rows.all():
        kind = KINDS.get(type_)
        llm = kind.llm_input(stored) if kind is not None and kind.engine else None
        if llm is None or pool_id is None or replica_id is None or not llm.params.samples:
            continue
        out.append(RecordedSample(step_id, pool_id, replica_id, llm.params.temperature))
    return out


async def check_strict(
    session: AsyncSession,
    *,
    flow_id: str,
    source: Run,
    settings: ReplaySettings,
    identities: dict[tuple[str, str], EngineIdentity],
    pools: Sequence[PoolView],
) -> None:
    """Refuse a strict_replay whose determinism inputs differ from the record, naming all;
    among them the engines that take no seed where a recorded step sampled."""
    mismatches = run_mismatches(
        recorded_flow=source.flow_id,
        requested_flow=flow_id,
        recorded_seed=source.seed,
        requested_seed=settings.seed,
        recorded_policy=source.policy,
        requested_policy=settings.policy,
        recorded_replicas=await recorded_replicas(session, source.run_id),
        current=identities,
    )
    mismatches += seedless_mismatches(
        recorded_seed=source.seed,
        sampled=await recorded_samples(session, source.run_id),
        features={p.pool_id: p.features for p in pools},
        engines={where: identity.engine for where, identity in identities.items()},
    )
    if mismatches:
        raise StrictReplayMismatch(mismatches)


def _outcome(step: Step) -> str:
    if not StepStatus(step.status).terminal:
        return "pending"
    return step.replay_outcome or "failed"


async def replay_report(session: AsyncSession, run: Run) -> dict[str, Any]:
    """Per step of a replay run: the recorded step it reproduces and how that went."""
    steps = (
        (
            await session.execute(
                sa.select(Step).where(Step.run_id == run.run_id).order_by(Step.position)
            )
        )
        .scalars()
        .all()
    )
    recorded = (
        (
            await session.execute(
                sa.select(Step.position, Step.step_id)
                .where(Step.run_id == run.source_run_id)
                .order_by(Step.position)
            )
        ).all()
        if run.source_run_id
        else []
    )
    rows: list[dict[str, Any]] = []
    for step in steps:
        outcome = _outcome(step)
        error = step.error or {}
        details = error.get("details") or {}
        rows.append(
            {
                "position": step.position,
                "step_id": step.step_id,
                "recorded_step_id": step.replay_of,
                "status": step.status,
                "outcome": outcome,
                "tokens_out": step.tokens_out,
                "divergence": details.get("divergence") if outcome == "diverged" else None,
                "miss": (
                    {"message": error.get("message"), **details} if outcome == "miss" else None
                ),
            }
        )
    replayed = {s.position for s in steps}
    for position, step_id in recorded:
        if position not in replayed:
            rows.append(
                {
                    "position": position,
                    "step_id": None,
                    "recorded_step_id": step_id,
                    "status": None,
                    "outcome": "not_replayed",
                    "tokens_out": 0,
                    "divergence": None,
                    "miss": None,
                }
            )
    rows.sort(key=lambda r: r["position"])
    counts = {
        k: 0 for k in ("identical", "diverged", "missed", "failed", "pending", "not_replayed")
    }
    for r in rows:
        key = {"miss": "missed", "cancelled": "failed"}.get(r["outcome"], r["outcome"])
        counts[key] += 1
    diverged = bool(counts["diverged"] or counts["missed"] or counts["failed"])
    return {
        "run_id": run.run_id,
        "source_run_id": run.source_run_id,
        "mode": run.mode,
        "diverged": diverged,
        "complete": not counts["pending"] and not counts["not_replayed"],
        "counts": counts,
        "steps": rows,
    }
