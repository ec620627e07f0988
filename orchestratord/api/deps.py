from __future__ import annotations

from fastapi import Request

from orchestratord.runtime import Orchestrator


async def orchestrator(request: Request) -> Orchestrator:
    """The app's orchestrator. ``async``: FastAPI runs a plain ``def`` dependency in its
    thread pool, a thread hop on every request."""
    orch: Orchestrator = request.app.state.orchestrator
    return orch
