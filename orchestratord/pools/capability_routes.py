"""The capability snapshot (``contracts.capabilities``), built from the pools when asked.

``/capabilities`` is the path the ``nrv`` CLI reads; ``/v1/capabilities`` is the same
answer beside the other resources. Both take a ``read`` key when keys are on, as
``GET /v1/pools`` does, and are never cached: the pools change.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from contracts.capabilities import CapabilitySnapshot
from orchestrator_core import clock
from orchestratord.api.auth import READ
from orchestratord.api.deps import orchestrator
from orchestratord.pools.capabilities import snapshot
from orchestratord.runtime import Orchestrator

router = APIRouter()


def _snapshot(orch: Orchestrator, response: Response) -> CapabilitySnapshot:
    response.headers["Cache-Control"] = "no-store"
    admission = orch.settings.admission
    return snapshot(
        orch.pools.pools.values(),
        queue_depth_limit=admission.interactive_capacity + admission.batch_capacity,
        captured_at=clock.now(),
    )


async def get_capabilities(
    response: Response, orch: Orchestrator = Depends(orchestrator)
) -> CapabilitySnapshot:
    return _snapshot(orch, response)


for _path, _summary in (
    (
        "/v1/capabilities",
        "The capability snapshot: models, workloads, limits and GPUs of the pools",
    ),
    ("/capabilities", "The capability snapshot, at the path the nrv CLI reads"),
):
    router.add_api_route(
        _path,
        get_capabilities,
        methods=["GET"],
        dependencies=[READ],
        response_model=CapabilitySnapshot,
        response_model_exclude_none=True,
        tags=["pools"],
        summary=_summary,
    )
