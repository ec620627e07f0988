from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import placement_to_json
from contracts.runs import RunComplete, RunCreate
from orchestrator_core import clock
from orchestrator_core.errors import InvalidParams, NotFound
from orchestrator_core.lifecycle import RunEnded, RunStatus, StepStatus
from orchestrator_core.placement import SEED, PoolView, placement_rule, validate_placement
from orchestrator_core.policy import RulePolicy
from orchestrator_core.replay import EngineIdentity
from orchestratord.db.models import Run, Step
from orchestratord.flows.service import get_flow
from orchestratord.fs.guard import FsGuard
from orchestratord.idempotency import Token
from orchestratord.prices import PriceBook
from orchestratord.replay.runs import check_strict, inherited
from orchestratord.runs.ledger import usage_of
from orchestratord.steps.transition import end_run, end_unstarted, live_steps, transition_run
from orchestratord.tx import Tx

# What a new run has used, reserved and written: nothing (a fork starts from nothing too).
NEW_RUN_ACCOUNT: dict[str, Any] = {
    "tokens_in_used": 0,
    "tokens_out_used": 0,
    "cost_used_usd": 0.0,
    "unpriced_steps": 0,
    "tokens_in_reserved": 0,
    "tokens_out_reserved": 0,
    "cost_reserved_usd": 0.0,
    "step_count": 0,
    "event_seq": 0,
}


# Seeds the server picks fit in 32 bits, which every engine accepts.
_SERVER_SEED_BOUND = 2**32


async def create_run(
    session: AsyncSession,
    *,
    flow_id: str,
    body: RunCreate,
    pools: list[PoolView],
    identities: dict[tuple[str, str], EngineIdentity],
    prices: PriceBook,
    price_table: str | None,
    fs: FsGuard,
) -> Run:
    """A new run; ``fs`` bounds its ``fs_policy`` roots, given or inherited from the recorded
    run (either door, every mode)."""
    await get_flow(session, flow_id=flow_id)
    if body.mode == "record" and body.source_run_id is not None:
        raise InvalidParams(
            "only replay and strict_replay runs have a source run", field="source_run_id"
        )
    if body.mode != "record" and body.source_run_id is None:
        raise InvalidParams(f"required when mode is {body.mode!r}", field="source_run_id")
    source: Run | None = None
    if body.source_run_id is not None:
        source = await session.get(Run, body.source_run_id)
        if source is None:
            raise InvalidParams("no run with this id", field="source_run_id")
    if body.mode == "record":
        seed = body.seed if body.seed is not None else secrets.randbelow(_SERVER_SEED_BOUND)
        policy = body.policy.model_dump(exclude_none=True)
        budgets = body.budgets.model_dump()
        pool_policy = placement_to_json(body.pool_policy)
        validate_placement(pool_policy, pools, field="pool_policy")
        if body.seed is not None:
            _check_seeded_pin(pool_policy, pools, identities)
        fs_policy = body.fs_policy.model_dump()
        price_version = (prices.get(price_table) if price_table else prices.latest()).version
    else:
        assert source is not None  # RunCreate requires it for the replay modes
        replay = inherited(body, source)
        if body.mode == "strict_replay":
            await check_strict(
                session,
                flow_id=flow_id,
                source=source,
                settings=replay,
                identities=identities,
                pools=pools,
            )
        seed, policy, budgets = replay.seed, replay.policy, replay.budgets
        pool_policy, fs_policy = replay.pool_policy, replay.fs_policy
        price_version = replay.price_table
        if body.mode == "strict_replay":  # it runs engines again, at the recorded prices
            try:
                prices.get(price_version)
            except NotFound:
                raise InvalidParams(
                    f"the recorded run's price table {price_version!r} is not installed here",
                    field="source_run_id",
                ) from None
    await fs.admit(fs_policy)
    evaluator = RulePolicy.from_policy(policy, field="policy")
    now = clock.now()
    run = Run(
        run_id=clock.new_id("run"),
        flow_id=flow_id,
        mode=body.mode,
        seed=seed,
        seed_given=body.seed is not None,
        source_run_id=body.source_run_id,
        status=RunStatus.RUNNING.value,
        budgets=budgets,
        policy=policy,
        policy_hash=evaluator.policy_hash,
        price_table=price_version,
        pool_policy=pool_policy,
        fs_policy=fs_policy,
        cancel_on_disconnect=body.cancel_on_disconnect,
        **NEW_RUN_ACCOUNT,
        created_at=now,
        updated_at=now,
    )
    if (token := Token.of(body)) is not None:
        token.stamp(run)
    session.add(run)
    await session.flush()
    return run


def _check_seeded_pin(
    pool_policy: Any, pools: list[PoolView], identities: dict[tuple[str, str], EngineIdentity]
) -> None:
    """A run given a seed and pinned to a pool whose engine takes no seed (as it reports
    now) is refused, naming the engine and ``seed``: none of its sampling steps could honour
    the seed. A pool whose engine has not reported its features is not refused. (Placed
    ``auto`` or by affinity, each sampling step of such a run goes where a seed is taken:
    ``Needs.of(llm, seeded=True)``.)"""
    if placement_rule(pool_policy) != "pin":
        return
    pool_id = pool_policy["pin"]
    view = next((p for p in pools if p.pool_id == pool_id), None)
    if view is None or view.features is None or SEED in view.features:
        return
    engines = sorted({str(i.engine) for (p, _), i in identities.items() if p == pool_id})
    engine = ", ".join(engines) or "unknown"
    raise InvalidParams(
        f"a seeded run needs an engine that takes a seed: pool_policy pins pool {pool_id!r}"
        f" (engine {engine}), which has none; leave seed out (its steps then sample"
        " unseeded) or pin a pool whose engine takes one",
        field="seed",
        details={"pool_id": pool_id, "engine": engine},
    )


async def get_run(session: AsyncSession, *, run_id: str, lock: bool = False) -> Run:
    stmt = sa.select(Run).where(Run.run_id == run_id)
    if lock:
        # Exclusive: a step's end reads the run's status under a shared lock to decide whether
        # the run ends now; a cancel or a completion must not interleave with that decision.
        stmt = stmt.with_for_update()
    run = (await session.execute(stmt)).scalar_one_or_none()
    if run is None:
        raise NotFound("run", run_id)
    return run


def run_view(run: Run) -> dict[str, Any]:
    return {
        **{
            c: getattr(run, c)
            for c in (
                "run_id",
                "flow_id",
                "mode",
                "seed",
                "source_run_id",
                "status",
                "budgets",
                "policy",
                "pool_policy",
                "fs_policy",
                "price_table",
                "policy_hash",
                "cancel_on_disconnect",
                "step_count",
                "output",
                "ended_at",
                "forked_from",
                "created_at",
                "updated_at",
            )
        },
        "usage": usage_of(run),
        "reserved": {
            "tokens_in": run.tokens_in_reserved,
            "tokens_out": run.tokens_out_reserved,
            "cost_usd": run.cost_reserved_usd,
        },
    }


async def cancel_run(tx: Tx, *, run_id: str) -> tuple[str, list[str]]:
    """Cancel queued steps now, ask running ones to stop; returns (status, running step ids)."""
    session = tx.session
    run = await get_run(session, run_id=run_id, lock=True)
    status = RunStatus(run.status)
    if status.terminal or status is RunStatus.CANCELLING:
        return run.status, []
    steps = (
        (
            await session.execute(
                sa.select(Step)
                .where(
                    Step.run_id == run_id,
                    Step.status.in_([StepStatus.QUEUED.value, StepStatus.RUNNING.value]),
                )
                .order_by(Step.step_id)
                .with_for_update(key_share=True)
            )
        )
        .scalars()
        .all()
    )
    running: list[str] = []
    for step in steps:
        if step.status == StepStatus.QUEUED.value:
            await end_unstarted(tx, step=step, status=StepStatus.CANCELLED)
        else:
            step.cancel_requested = True
            running.append(step.step_id)
    target = RunStatus.CANCELLING if running else RunStatus.CANCELLED
    transition_run(run, target)
    if target is RunStatus.CANCELLED:
        await tx.append_events([end_run(run)])
    return run.status, running


async def complete_run(tx: Tx, *, run_id: str, body: RunComplete) -> Run:
    """The interpreter's last word: the run ends ``succeeded`` or ``failed`` and takes no more
    steps or facts. Its ``run_end`` follows once no step of it is live. Repeating the same
    request answers the same run (clients retry)."""
    run = await get_run(tx.session, run_id=run_id, lock=True)
    status, wanted = RunStatus(run.status), RunStatus(body.status)
    if status is not RunStatus.RUNNING:
        if status is wanted and run.output == body.output:
            return run
        raise RunEnded(
            f"run is {status.value}: it cannot be completed as {wanted.value}",
            details={"status": status.value},
        )
    transition_run(run, wanted)
    run.output = body.output
    if await live_steps(tx.session, run_id) == 0:
        await tx.append_events([end_run(run)])
    return run


async def list_runs(
    session: AsyncSession,
    *,
    flow_id: str | None,
    status: str | None,
    after: str | None,
    limit: int,
) -> Sequence[Run]:
    """Newest first (run ids sort by creation time); ``after`` is the last run id seen."""
    stmt = sa.select(Run)
    if flow_id is not None:
        stmt = stmt.where(Run.flow_id == flow_id)
    if status is not None:
        if status not in {s.value for s in RunStatus}:
            raise InvalidParams(
                f"unknown status {status!r} (one of {', '.join(s.value for s in RunStatus)})",
                field="query.status",
            )
        stmt = stmt.where(Run.status == status)
    if after is not None:
        stmt = stmt.where(Run.run_id < after)
    return (await session.execute(stmt.order_by(Run.run_id.desc()).limit(limit))).scalars().all()
