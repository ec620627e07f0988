from __future__ import annotations

from fastapi import Request

from orchestratord.runtime import Orchestrator


def orchestrator(request: Request) -> Orchestrator:
    orch: Orchestrator = request.app.state.orchestrator
    return orch
