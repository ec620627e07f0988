"""Facts and checkpoints of a run."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, Depends, Query, Response

from contracts.records import CheckpointCreate, CheckpointOut, FactCreate, FactOut
from orchestratord.api.deps import orchestrator
from orchestratord.db.models import Fact
from orchestratord.facts import service as repo
from orchestratord.runtime import Orchestrator

router = APIRouter()


@router.post("/v1/runs/{run_id}/facts", status_code=201, response_model=FactOut, tags=["facts"])
async def emit_fact(
    run_id: str, body: FactCreate, orch: Orchestrator = Depends(orchestrator)
) -> FactOut:
    async with orch.tx() as tx:
        fact = await repo.emit_fact(tx, run_id=run_id, body=body)
        return FactOut.model_validate(fact, from_attributes=True)


@router.get("/v1/runs/{run_id}/facts", response_model=list[FactOut], tags=["facts"])
async def list_facts(
    run_id: str,
    response: Response,
    type: str | None = Query(default=None, description="only facts of this type"),
    after: str | None = Query(default=None, description="a fact_id: list the facts after it"),
    limit: int = Query(default=100, ge=1, le=1000),
    orch: Orchestrator = Depends(orchestrator),
) -> list[FactOut]:
    async with orch.db.read() as session:
        facts = await repo.list_facts(
            session, run_id=run_id, fact_type=type, after=after, limit=limit
        )
    return _page(facts, limit, response)


@router.get("/v1/flows/{flow_id}/facts", response_model=list[FactOut], tags=["facts"])
async def list_flow_facts(
    flow_id: str,
    response: Response,
    type: str | None = Query(default=None, description="only facts of this type"),
    after: str | None = Query(default=None, description="a fact_id: list the facts after it"),
    limit: int = Query(default=100, ge=1, le=1000),
    orch: Orchestrator = Depends(orchestrator),
) -> list[FactOut]:
    """Facts of every run of the flow, in append order; paged as a run's facts are."""
    async with orch.db.read() as session:
        facts = await repo.list_flow_facts(
            session, flow_id=flow_id, fact_type=type, after=after, limit=limit
        )
    return _page(facts, limit, response)


@router.post(
    "/v1/runs/{run_id}/checkpoint",
    status_code=201,
    response_model=CheckpointOut,
    tags=["checkpoints"],
)
async def create_checkpoint(
    run_id: str, body: CheckpointCreate, orch: Orchestrator = Depends(orchestrator)
) -> CheckpointOut:
    async with orch.tx() as tx:
        cp = await repo.create_checkpoint(tx.session, run_id=run_id, body=body)
        return CheckpointOut.model_validate(cp, from_attributes=True)


@router.get(
    "/v1/runs/{run_id}/checkpoints", response_model=list[CheckpointOut], tags=["checkpoints"]
)
async def list_checkpoints(
    run_id: str, orch: Orchestrator = Depends(orchestrator)
) -> list[CheckpointOut]:
    async with orch.db.read() as session:
        cps = await repo.list_checkpoints(session, run_id=run_id)
        return [CheckpointOut.model_validate(c, from_attributes=True) for c in cps]


def _page(facts: Sequence[Fact], limit: int, response: Response) -> list[FactOut]:
    """A page of facts; with ``limit`` full, ``X-Next-After`` is the next page's ``after``."""
    out = [FactOut.model_validate(f, from_attributes=True) for f in facts]
    if len(out) == limit:
        response.headers["X-Next-After"] = out[-1].fact_id
    return out
