from __future__ import annotations

import math

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.flows import FlowCreate
from orchestrator_core import clock
from orchestrator_core.errors import NotFound
from orchestrator_core.flows import FlowContent, FlowLimits, normalize_flow
from orchestrator_core.schemas.bounds import bounded_call
from orchestratord.db.models import Flow


async def create_flow(
    session: AsyncSession, *, body: FlowCreate, limits: FlowLimits | None = None
) -> tuple[Flow, bool]:
    """Store a flow by content; the same content returns the stored flow (created=False),
    also when a concurrent request (in any process) stored it first.

    Its schemas are checked off the event loop where the caller offloads
    (``Validation.offloading``): about a millisecond per subschema on the meta-schema alone,
    each schema within ``validation.deadline_s``."""

    def normalized() -> FlowContent:
        return normalize_flow(
            ast=body.ast,
            # unset optional executor fields are not content: adding one keeps old flow ids
            tools=[t.model_dump(mode="json", exclude_none=True) for t in body.tools],
            config=body.config,
            limits=limits,
        )

    content = bounded_call(b"flow", body, lambda: math.inf, normalized, seconds=math.inf)
    existing = await session.get(Flow, content.flow_id)
    if existing is not None:
        return existing, False
    flow = Flow(
        flow_id=content.flow_id,
        hash=content.hash,
        ast=content.ast,
        tools=content.tools,
        config=content.config,
        labels=body.labels,
        created_at=clock.now(),
    )
    try:  # another process may store the same content meanwhile: then that flow is it
        async with session.begin_nested():
            session.add(flow)
    except IntegrityError:
        stored = await session.get(Flow, content.flow_id, populate_existing=True)
        if stored is None:
            raise
        return stored, False
    return flow, True


async def get_flow(session: AsyncSession, *, flow_id: str) -> Flow:
    flow = await session.get(Flow, flow_id)
    if flow is None:
        raise NotFound("flow", flow_id)
    return flow


async def get_flow_by_hash(session: AsyncSession, *, content_hash: str) -> Flow:
    wanted = content_hash if content_hash.startswith("sha256:") else f"sha256:{content_hash}"
    flow = (await session.execute(sa.select(Flow).where(Flow.hash == wanted))).scalar_one_or_none()
    if flow is None:
        raise NotFound("flow", content_hash)
    return flow
