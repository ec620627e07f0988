from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Response
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.replay import ReplayReport
from contracts.runs import CancelOut, RunComplete, RunCreate, RunFork, RunOut
from contracts.steps import StepOut
from orchestrator_core.errors import InvalidParams
from orchestratord.api.auth import READ, WRITE
from orchestratord.api.budget_headers import set_budget_headers
from orchestratord.api.deps import orchestrator
from orchestratord.db.models import Run
from orchestratord.idempotency import Token, answer_once, first_of
from orchestratord.replay.runs import replay_report
from orchestratord.runs import service as repo
from orchestratord.runs.forks import fork_run
from orchestratord.runtime import Orchestrator
from orchestratord.steps.queries import list_steps, step_view
from orchestratord.tx import Tx

router = APIRouter(tags=["runs"])


@router.post(
    "/v1/flows/{flow_id}/runs", dependencies=[WRITE], status_code=201, response_model=RunOut
)
async def create_run(
    flow_id: str, body: RunCreate, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> RunOut:
    async def find(session: AsyncSession, token: Token) -> Run | None:
        return await first_of(session, Run, Run.flow_id == flow_id, token)

    async def make(tx: Tx) -> Run:
        return await open_run(orch, tx.session, flow_id, body)

    run, made = await answer_once(orch.db, orch.tx, Token.of(body), find, make)
    if not made:
        response.status_code = 200
    set_budget_headers(response, run)
    return RunOut.model_validate(repo.run_view(run))


async def open_run(orch: Orchestrator, session: AsyncSession, flow_id: str, body: RunCreate) -> Run:
    """A new run of ``flow_id``, placed over the pools as they are now (either front door)."""
    return await repo.create_run(
        session,
        flow_id=flow_id,
        body=body,
        pools=orch.pools.views(),
        identities=orch.pools.identities(),
        prices=orch.prices,
        price_table=orch.settings.price_table,
        fs=orch.services.fs,
    )


@router.get("/v1/runs/{run_id}", dependencies=[READ], response_model=RunOut)
async def get_run(
    run_id: str, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> RunOut:
    async with orch.db.read() as session:
        run = await repo.get_run(session, run_id=run_id)
        set_budget_headers(response, run)
        return RunOut.model_validate(repo.run_view(run))


@router.get("/v1/runs", dependencies=[READ], response_model=list[RunOut])
async def list_runs(
    response: Response,
    flow_id: str | None = Query(default=None, description="only runs of this flow"),
    status: str | None = Query(default=None, description="only runs in this status"),
    after: str | None = Query(default=None, description="a run_id: list the runs older than it"),
    limit: int = Query(default=100, ge=1, le=1000),
    orch: Orchestrator = Depends(orchestrator),
) -> list[RunOut]:
    """Newest first; with ``limit`` full, ``X-Next-After`` is the ``after`` of the next page."""
    async with orch.db.read() as session:
        runs = await repo.list_runs(
            session, flow_id=flow_id, status=status, after=after, limit=limit
        )
        out = [RunOut.model_validate(repo.run_view(r)) for r in runs]
    if len(out) == limit:
        response.headers["X-Next-After"] = out[-1].run_id
    return out


@router.post("/v1/runs/{run_id}/complete", dependencies=[WRITE], response_model=RunOut)
async def complete_run(
    run_id: str, body: RunComplete, orch: Orchestrator = Depends(orchestrator)
) -> RunOut:
    async with orch.tx() as tx:
        run = await repo.complete_run(tx, run_id=run_id, body=body)
        return RunOut.model_validate(repo.run_view(run))


@router.post("/v1/runs/{run_id}/fork", dependencies=[WRITE], status_code=201, response_model=RunOut)
async def fork(
    run_id: str, body: RunFork, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> RunOut:
    """A new record run from a checkpoint: the facts up to it and the checkpoint itself. A
    ``client_token`` makes a repeat answer the first fork (200); it is unique in the flow, as
    for a created run."""

    async def find(session: AsyncSession, token: Token) -> Run | None:
        parent = await repo.get_run(session, run_id=run_id)
        return await first_of(session, Run, Run.flow_id == parent.flow_id, token)

    async def make(tx: Tx) -> Run:
        return await fork_run(tx, run_id=run_id, body=body, fs=orch.services.fs)

    run, made = await answer_once(orch.db, orch.tx, Token.of(body), find, make)
    if not made:
        response.status_code = 200
    return RunOut.model_validate(repo.run_view(run))


@router.post(
    "/v1/runs/{run_id}/cancel", dependencies=[WRITE], status_code=202, response_model=CancelOut
)
async def cancel_run(run_id: str, orch: Orchestrator = Depends(orchestrator)) -> CancelOut:
    async with orch.tx() as tx:
        status, running = await repo.cancel_run(tx, run_id=run_id)
    for step_id in running:
        orch.dispatcher.cancel(step_id)
    return CancelOut(status=status)


@router.get("/v1/runs/{run_id}/steps", dependencies=[READ], response_model=list[StepOut])
async def get_run_steps(run_id: str, orch: Orchestrator = Depends(orchestrator)) -> list[StepOut]:
    """The run's steps in submission order (``position``)."""
    async with orch.db.read() as session:
        await repo.get_run(session, run_id=run_id)
        steps = await list_steps(session, run_id=run_id)
        return [StepOut.model_validate(step_view(s)) for s in steps]


@router.get("/v1/runs/{run_id}/replay-report", dependencies=[READ], response_model=ReplayReport)
async def get_replay_report(
    run_id: str, orch: Orchestrator = Depends(orchestrator)
) -> ReplayReport:
    """How a replay run compares with its recorded run, step by step."""
    async with orch.db.read() as session:
        run = await repo.get_run(session, run_id=run_id)
        if run.mode == "record":
            raise InvalidParams(
                "a record run has no replay report; ask for the report of a replay run",
                field="run_id",
            )
        return ReplayReport.model_validate(await replay_report(session, run))
