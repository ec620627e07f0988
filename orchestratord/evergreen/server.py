"""The Evergreen front door: ``EvergreenService.StartSession`` served in this process, over
the same database, auth, budgets, policy and placement as the HTTP API.

A session opens a run: metadata ``x-flow-id`` names the flow and ``x-run`` carries the JSON
body of ``POST /v1/flows/{id}/runs`` (mode, seed, budgets, policy, placement,
``source_run_id``); the server's initial metadata carries ``x-run-id``. Auth is the HTTP
API's: ``authorization: Bearer <key>`` with write scope (none while auth is off).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped]
import orjson

from contracts.protos import load
from orchestrator_core import keys
from orchestrator_core.errors import Forbidden, OrchestratorError
from orchestrator_core.keys import Principal
from orchestratord.evergreen.run_body import run_body
from orchestratord.evergreen.session import DONE, Session
from orchestratord.evergreen.status import named_status, status_for
from orchestratord.flows.service import get_flow
from orchestratord.runs.routes import open_run
from orchestratord.runtime import Orchestrator

log = logging.getLogger(__name__)


class Refused(Exception):
    """The session cannot open: a gRPC status and the error body."""

    def __init__(self, status: grpc.StatusCode, message: str, body: dict[str, Any]) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body


def _refused(exc: OrchestratorError) -> Refused:
    return Refused(status_for(exc.code, retriable=exc.retriable), exc.message, exc.body())


def _bad(message: str, field: str) -> Refused:
    body = {"code": "INVALID_PARAMS", "message": message, "details": {"field": field}}
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message, body)


async def _principal(
    orch: Orchestrator, metadata: dict[str, str], address: str
) -> Principal | None:
    guard = orch.auth
    if not await guard.enabled():
        return None
    try:
        principal = await guard.principal_from(keys.bearer(metadata.get("authorization")), address)
        if not principal.allows(keys.Scope.WRITE):
            raise _forbidden(principal)
        orch.rates.request(principal.key_id)
    except OrchestratorError as exc:
        orch.metrics.refusals.labels(exc.code).inc()
        raise _refused(exc) from None
    return principal


def _address(peer: str) -> str:
    """The client's address of a gRPC peer (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``)."""
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0] if kind in ("ipv4", "ipv6") else rest
    return host.strip("[]")


def _forbidden(principal: Principal) -> OrchestratorError:
    return Forbidden(
        f"key {principal.key_id} has scope {principal.scope.label}; a session needs write",
        required=keys.Scope.WRITE.label,
        scope=principal.scope.label,
    )


class EvergreenService:
    """The servicer: one :class:`Session` per call."""

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch
        self.pb = load()
        self._ending: set[asyncio.Task[None]] = set()

    async def _open(self, context: grpc.aio.ServicerContext) -> Session:
        orch = self.orch
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        principal = await _principal(orch, metadata, _address(context.peer() or ""))
        flow_id = metadata.get("x-flow-id")
        if not flow_id:
            raise _bad("metadata x-flow-id: the flow of the session's run is required", "x-flow-id")
        try:
            body = run_body(metadata.get("x-run"), max_bytes=orch.settings.limits.max_body_bytes)
            async with orch.tx() as tx:
                flow = await get_flow(tx.session, flow_id=flow_id)
                run = await open_run(orch, tx.session, flow_id, body)
                run_id, seed, fs_policy = run.run_id, run.seed, run.fs_policy
                tools = [str(t.get("name")) for t in flow.tools or () if t.get("name")]
        except OrchestratorError as exc:
            raise _refused(exc) from None
        return Session(
            orch,
            self.pb,
            run_id=run_id,
            seed=seed,
            principal=principal,
            tools=tools,
            fs_policy=fs_policy,
        )

    async def StartSession(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        try:
            session = await self._open(context)
        except Refused as exc:
            await _abort(context, exc.status, exc.message, exc.body)
            return
        await context.send_initial_metadata((("x-run-id", session.run_id),))
        reader = asyncio.create_task(session.consume(requests))
        worker = asyncio.create_task(session.work())
        ended = False
        try:
            while (message := await session.out.get()) is not DONE:
                yield message
            ended = True
        finally:
            reader.cancel()
            worker.cancel()
            # a client that cancels cancels this call: the run ends cancelled, after it
            self._end(session, cancelled=not ended)
        await self._wait_ended()  # the run's end is written before the call's
        failure = session.failure
        if failure is not None:
            await _abort(context, named_status(failure.code), failure.message, failure.body)

    def _end(self, session: Session, *, cancelled: bool) -> None:
        task = asyncio.get_running_loop().create_task(session.end_run(cancelled=cancelled))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _wait_ended(self) -> None:
        if self._ending:
            await asyncio.gather(*list(self._ending), return_exceptions=True)

    async def aclose(self) -> None:
        await self._wait_ended()


async def _abort(
    context: grpc.aio.ServicerContext, status: grpc.StatusCode, message: str, body: dict[str, Any]
) -> None:
    context.set_trailing_metadata((("x-error", orjson.dumps(body).decode()),))
    await context.abort(status, message)


class EvergreenServer:
    """The gRPC server of the front door, started and stopped with the service."""

    def __init__(self, orch: Orchestrator, *, host: str, port: int) -> None:
        self.orch = orch
        self.host = host
        self.port = port
        self.service = EvergreenService(orch)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Listen; the port bound (``port`` 0: a free one)."""
        server = grpc.aio.server()
        self.service.pb.evergreen_grpc.add_EvergreenServiceServicer_to_server(self.service, server)
        bound = int(server.add_insecure_port(f"{self.host}:{self.port}"))
        if bound == 0:
            raise OSError(f"evergreen: cannot listen on {self.host}:{self.port}")
        await server.start()
        self._server, self.port = server, bound
        log.info("evergreen front door on %s:%d", self.host, bound)
        return bound

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.stop(grace_s)
        await self.service.aclose()
