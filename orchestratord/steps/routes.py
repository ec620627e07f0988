from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from contracts.runs import CancelOut
from contracts.steps import AnyStepCreate, StepAccepted, StepCreate, StepOut
from orchestrator_core.keys import Principal
from orchestratord.api.auth import READ, WRITE
from orchestratord.api.budget_headers import set_budget_headers
from orchestratord.api.deps import orchestrator
from orchestratord.api.responses import JsonResponse
from orchestratord.runs.service import get_run
from orchestratord.runtime import Orchestrator
from orchestratord.steps.kinds import kind_of
from orchestratord.steps.queries import get_step as read_step
from orchestratord.steps.queries import step_view
from orchestratord.steps.submission import submit_step as submit

router = APIRouter(tags=["steps"])


@router.post(
    "/v1/runs/{run_id}/steps",
    status_code=202,
    response_model=StepAccepted,
    responses={200: {"model": StepAccepted, "description": "a repeated client_token: the first"}},
)
async def submit_step(
    run_id: str, body: StepCreate, request: Request, principal: Principal | None = WRITE
) -> Response:
    # the hottest route: answered by api/hot_routes.py before FastAPI's routing when the
    # request is well formed; what it hands on (errors included) lands here
    return await answer_submission(request.app.state.orchestrator, run_id, body, principal)


async def answer_submission(
    orch: Orchestrator, run_id: str, typed: AnyStepCreate, principal: Principal | None
) -> Response:
    """The submission's answer, encoded here, not validated again through the response model
    (the model still documents it)."""
    if principal is not None:
        orch.rates.check_tokens(principal.key_id)
    async with orch.tx() as tx:
        done = await submit(tx, run_id=run_id, body=typed, ctx=orch.submit_context)
        step = done.step
        status = step_view(step)["status"]
        response = JsonResponse(
            {"step_id": step.step_id, "status": status}, status_code=202 if done.created else 200
        )
        set_budget_headers(response, done.run, done.ledger)
        fresh = done.created and status in ("queued", "running")
        if fresh and orch.hub_sees_every_write:
            # its log is empty until this commits: its streams start from memory
            step_id = step.step_id
            tx.on_rollback(lambda: orch.hub.forget_step(step_id))
            orch.hub.expect_step(step_id, cancel_on_disconnect=step.cancel_on_disconnect)
    if done.created:
        if principal is not None:
            orch.rates.add_tokens(
                principal.key_id, step.tokens_in_reserved + step.tokens_out_reserved
            )
        if status == "queued":  # a running one started with its submission
            orch.dispatcher.wake(control=not kind_of(typed.type).engine)
    return response


@router.get("/v1/steps/{step_id}", dependencies=[READ], response_model=StepOut)
async def get_step(
    step_id: str, response: Response, orch: Orchestrator = Depends(orchestrator)
) -> StepOut:
    async with orch.db.read() as session:
        step = await read_step(session, step_id=step_id)
        set_budget_headers(response, await get_run(session, run_id=step.run_id))
        return StepOut.model_validate(step_view(step))


@router.post(
    "/v1/steps/{step_id}/cancel", dependencies=[WRITE], status_code=202, response_model=CancelOut
)
async def cancel_step(step_id: str, orch: Orchestrator = Depends(orchestrator)) -> CancelOut:
    return CancelOut(status=await orch.cancel_step(step_id))
