from __future__ import annotations

from fastapi import APIRouter, Depends, Header, Request, Response

from contracts.runs import CancelOut
from contracts.steps import AnyStepCreate, StepAccepted, StepCreate, StepOut
from orchestrator_core.keys import Principal
from orchestratord.api.auth import READ, WRITE
from orchestratord.api.budget_headers import set_budget_headers
from orchestratord.api.deps import orchestrator
from orchestratord.api.responses import JsonResponse
from orchestratord.db.models import Step
from orchestratord.runs.service import get_run
from orchestratord.runtime import Orchestrator
from orchestratord.steps.kinds import kind_of
from orchestratord.steps.queries import get_step as read_step
from orchestratord.steps.queries import shown_status, step_view
from orchestratord.steps.submission import Submitted
from orchestratord.steps.submission import submit_step as submit
from orchestratord.streams.routes import admit as admit_stream
from orchestratord.streams.routes import let_go, submitted_step_stream

router = APIRouter(tags=["steps"])


# with ``Accept: text/event-stream`` either answer is the step's stream instead
_OR_STREAMED = (
    "; with `Accept: text/event-stream`, the step's stream from its first event instead"
    " (`X-Step-Id` names the step; resume at `Location` with `Last-Event-ID`)"
)


@router.post(
    "/v1/runs/{run_id}/steps",
    status_code=202,
    response_model=StepAccepted,
    responses={
        202: {
            "description": "the step, made" + _OR_STREAMED,
            "content": {"text/event-stream": {}},
        },
        200: {
            "model": StepAccepted,
            "description": "a repeated client_token: the first step" + _OR_STREAMED,
            "content": {"text/event-stream": {}},
        },
    },
)
async def submit_step(
    run_id: str,
    body: StepCreate,
    request: Request,
    accept: str | None = Header(default=None),
    principal: Principal | None = WRITE,
) -> Response:
    # the hottest route: answered by api/hot_routes.py before FastAPI's routing when the
    # request is well formed; what it hands on (errors included) lands here
    orch = request.app.state.orchestrator
    return await answer_submission(orch, run_id, body, principal, stream=wants_stream(accept))


def wants_stream(accept: str | bytes | None) -> bool:
    """``Accept`` names ``text/event-stream`` (its parameters and case aside)."""
    if accept is None:
        return False
    text = accept.decode("latin-1") if isinstance(accept, bytes) else accept
    return any(
        part.split(";", 1)[0].strip().lower() == "text/event-stream" for part in text.split(",")
    )


async def answer_submission(
    orch: Orchestrator,
    run_id: str,
    typed: AnyStepCreate,
    principal: Principal | None,
    *,
    stream: bool = False,
) -> Response:
    """The submission's answer, encoded here, not validated again through the response model
    (the model still documents it). ``stream``: the answer is the step's stream, admitted
    (the process's and the key's stream limits) before the step is made."""
    if stream:
        admit_stream(orch, principal)
    try:
        done = await submit_now(orch, run_id, typed, principal)
    except BaseException:
        if stream:
            let_go(orch, principal)
        raise
    step = done.step
    response = JsonResponse(
        {"step_id": step.step_id, "status": shown_status(step)},
        status_code=202 if done.created else 200,
    )
    set_budget_headers(response, done.run, done.ledger)
    if stream:
        own = {k: v for k, v in response.headers.items() if k.startswith("x-budget-")}
        own["x-step-id"] = step.step_id
        own["location"] = f"/v1/steps/{step.step_id}/stream"
        return submitted_step_stream(
            orch,
            principal,
            step_id=step.step_id,
            cancel_on_disconnect=bool(step.cancel_on_disconnect),
            status_code=response.status_code,
            own_headers=own,
        )
    return response


async def submit_now(
    orch: Orchestrator, run_id: str, typed: AnyStepCreate, principal: Principal | None
) -> Submitted:
    """Submit a step as ``POST /v1/runs/{run_id}/steps`` does, whatever the front door: the
    key's token rate, the submission's transaction, its stream announced to the hub, the
    dispatcher woken for a queued step."""
    if principal is not None:
        orch.rates.check_tokens(principal.key_id)
    announced: list[str] = []

    async def submitted() -> Submitted:
        async with orch.tx() as tx:

            def announce(new: Step) -> None:
                # its log is empty until it commits: its streams start from memory
                step_id = new.step_id
                announced.append(step_id)
                tx.on_rollback(lambda: orch.hub.forget_step(step_id))
                orch.hub.expect_step(step_id, cancel_on_disconnect=new.cancel_on_disconnect)

            return await submit(
                tx,
                run_id=run_id,
                body=typed,
                ctx=orch.submit_context,
                announce=announce if orch.hub_sees_every_write else None,
            )

    # costly tool args are checked on a worker thread, outside the transaction
    done = await orch.validation.offloading(submitted)
    step = done.step
    for step_id in announced:  # made, but not stored (its token taken meanwhile...)
        if step_id != step.step_id or not done.created:
            orch.hub.forget_step(step_id)
    if done.created:
        if principal is not None:
            orch.rates.add_tokens(
                principal.key_id, step.tokens_in_reserved + step.tokens_out_reserved
            )
        if shown_status(step) == "queued":  # a running one started with its submission
            orch.dispatcher.wake(control=not kind_of(typed.type).engine)
    return done


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
