from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from contracts.runs import CancelOut
from contracts.steps import StepAccepted, StepCreate, StepOut
from orchestratord.api.budget_headers import set_budget_headers
from orchestratord.api.deps import orchestrator
from orchestratord.repo import steps as repo
from orchestratord.repo.runs import get_run
from orchestratord.runtime import Orchestrator

router = APIRouter(tags=["steps"])


@router.post("/v1/runs/{run_id}/steps", status_code=202, response_model=StepAccepted)
async def submit_step(
    run_id: str, body: StepCreate, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> StepAccepted:
    started = None
    try:
        async with orch.tx() as tx:
            done = await repo.submit_step(tx, run_id=run_id, body=body, ctx=orch.submit_context)
            if done.created and done.price is not None:
                started = await orch.dispatcher.claim_at_submit(
                    tx.session, step=done.step, run=done.run, price=done.price
                )
            out = StepAccepted(
                step_id=done.step.step_id, status=repo.step_view(done.step)["status"]
            )
            set_budget_headers(response, done.run, done.ledger)
    except BaseException:
        if started is not None:
            orch.dispatcher.abandon(started)
        raise
    if started is not None:
        orch.dispatcher.launch(started)
    elif done.created:
        orch.dispatcher.wake()
    if not done.created:
        response.status_code = 200
    return out


@router.get("/v1/steps/{step_id}", response_model=StepOut)
async def get_step(
    step_id: str, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> StepOut:
    async with orch.db.read() as session:
        step = await repo.get_step(session, step_id=step_id)
        set_budget_headers(response, await get_run(session, run_id=step.run_id))
        return StepOut.model_validate(repo.step_view(step))


@router.post("/v1/steps/{step_id}/cancel", status_code=202, response_model=CancelOut)
async def cancel_step(step_id: str, orch: Orchestrator = Depends(orchestrator)) -> CancelOut:
    return CancelOut(status=await orch.cancel_step(step_id))
