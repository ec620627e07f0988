"""Facts and checkpoints of a run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, Query, Response
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.records import CheckpointCreate, CheckpointOut, FactCreate, FactOut
from orchestratord.api.auth import READ, WRITE
from orchestratord.api.deps import orchestrator
from orchestratord.db.models import Checkpoint, Fact
from orchestratord.facts import service as repo
from orchestratord.idempotency import Token, answer_once, first_of
from orchestratord.runtime import Orchestrator
from orchestratord.tx import Tx

router = APIRouter()


class FactPage:
    """The query of a fact listing: a type filter and cursor paging."""

    def __init__(
        self,
        type: str | None = Query(default=None, description="only facts of this type"),
        after: str | None = Query(default=None, description="a fact_id: list the facts after it"),
        limit: int = Query(default=100, ge=1, le=1000),
    ) -> None:
        self.type, self.after, self.limit = type, after, limit

    def filters(self) -> dict[str, Any]:
        return {"fact_type": self.type, "after": self.after, "limit": self.limit}

    def answer(self, facts: Sequence[Fact], response: Response) -> list[FactOut]:
        """The page; with ``limit`` full, ``X-Next-After`` is the next page's ``after``."""
        out = [FactOut.model_validate(f, from_attributes=True) for f in facts]
        if len(out) == self.limit:
            response.headers["X-Next-After"] = out[-1].fact_id
        return out


@router.post(
    "/v1/runs/{run_id}/facts",
    dependencies=[WRITE],
    status_code=201,
    response_model=FactOut,
    tags=["facts"],
)
async def emit_fact(
    run_id: str, body: FactCreate, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> FactOut:
    async def find(session: AsyncSession, token: Token) -> FactOut | None:
        fact = await first_of(session, Fact, Fact.run_id == run_id, token)
        return None if fact is None else FactOut.model_validate(fact, from_attributes=True)

    async def make(tx: Tx) -> FactOut:
        fact = await repo.emit_fact(tx, run_id=run_id, body=body)
        return FactOut.model_validate(fact, from_attributes=True)

    # costly data (its schema, its redaction) is checked on a worker thread, outside the
    # transaction
    out, made = await orch.validation.offloading(
        lambda: answer_once(orch.db, orch.tx, Token.of(body), find, make)
    )
    if not made:
        response.status_code = 200
    return out


@router.get(
    "/v1/runs/{run_id}/facts", dependencies=[READ], response_model=list[FactOut], tags=["facts"]
)
async def list_facts(
    run_id: str,
    response: Response,
    page: FactPage = Depends(),
    orch: Orchestrator = Depends(orchestrator),
) -> list[FactOut]:
    async with orch.db.read() as session:
        facts = await repo.list_facts(session, run_id=run_id, **page.filters())
    return page.answer(facts, response)


@router.get(
    "/v1/flows/{flow_id}/facts", dependencies=[READ], response_model=list[FactOut], tags=["facts"]
)
async def list_flow_facts(
    flow_id: str,
    response: Response,
    page: FactPage = Depends(),
    orch: Orchestrator = Depends(orchestrator),
) -> list[FactOut]:
    """Facts of every run of the flow, in append order; paged as a run's facts are."""
    async with orch.db.read() as session:
        facts = await repo.list_flow_facts(session, flow_id=flow_id, **page.filters())
    return page.answer(facts, response)


@router.post(
    "/v1/runs/{run_id}/checkpoint",
    dependencies=[WRITE],
    status_code=201,
    response_model=CheckpointOut,
    tags=["checkpoints"],
)
async def create_checkpoint(
    run_id: str,
    body: CheckpointCreate,
    response: Response,
    orch: Orchestrator = Depends(orchestrator),
) -> CheckpointOut:
    async def find(session: AsyncSession, token: Token) -> CheckpointOut | None:
        cp = await first_of(session, Checkpoint, Checkpoint.run_id == run_id, token)
        return None if cp is None else CheckpointOut.model_validate(cp, from_attributes=True)

    async def make(tx: Tx) -> CheckpointOut:
        cp = await repo.create_checkpoint(tx.session, run_id=run_id, body=body)
        return CheckpointOut.model_validate(cp, from_attributes=True)

    out, made = await answer_once(orch.db, orch.tx, Token.of(body), find, make)
    if not made:
        response.status_code = 200
    return out


@router.get(
    "/v1/runs/{run_id}/checkpoints",
    dependencies=[READ],
    response_model=list[CheckpointOut],
    tags=["checkpoints"],
)
async def list_checkpoints(
    run_id: str, orch: Orchestrator = Depends(orchestrator)
) -> list[CheckpointOut]:
    async with orch.db.read() as session:
        cps = await repo.list_checkpoints(session, run_id=run_id)
        return [CheckpointOut.model_validate(c, from_attributes=True) for c in cps]
