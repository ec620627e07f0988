"""Run bundles: export a finished run, import it into another database with its ids."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from contracts.common import ErrorBody
from contracts.runs import RunOut
from contracts.transfer import RunBundle
from orchestratord.api.auth import ADMIN, READ
from orchestratord.api.budget_headers import set_budget_headers
from orchestratord.api.deps import orchestrator
from orchestratord.api.responses import JsonResponse
from orchestratord.runs import transfer as repo
from orchestratord.runs.service import run_view
from orchestratord.runtime import Orchestrator

router = APIRouter(tags=["runs"])


@router.get(
    "/v1/runs/{run_id}/export",
    dependencies=[READ],
    response_model=RunBundle,
    responses={409: {"model": ErrorBody, "description": "steps of the run have not ended"}},
)
async def export_run(run_id: str, orch: Orchestrator = Depends(orchestrator)) -> JsonResponse:
    async with orch.db.read() as session:
        bundle = await repo.export_run(session, run_id)
    return JsonResponse(bundle)


@router.post(
    "/v1/runs:import",
    dependencies=[ADMIN],
    status_code=201,
    response_model=RunOut,
    responses={
        200: {"model": RunOut, "description": "the same bundle was imported before"},
        409: {"model": ErrorBody, "description": "the run or its flow exists with other content"},
    },
)
async def import_run(
    body: RunBundle, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> RunOut:
    async with orch.tx() as tx:
        run, created = await repo.import_run(tx, body)
        set_budget_headers(response, run)
        out = RunOut.model_validate(run_view(run))
    if not created:
        response.status_code = 200
    return out
