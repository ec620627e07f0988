"""The Evergreen front door: ``EvergreenService.StartSession`` served in this process, over
the same database, auth, budgets, policy and placement as the HTTP API.

A session opens a run: metadata ``x-flow-id`` names the flow and ``x-run`` carries the JSON
body of ``POST /v1/flows/{id}/runs`` (mode, seed, budgets, policy, placement,
``source_run_id``); the server's initial metadata carries ``x-run-id``. Auth is the HTTP
API's: ``authorization: Bearer <key>`` with write scope (none while auth is off).

A client that goes away without half-closing (its connection dropped, its call cancelled)
ends the run ``cancelled``, never ``succeeded``: grpc tells a dropped connection's end of
messages as a half-close, and its cancel of the call may come later, so before a session
completes its run the client must have taken a message sent after its half-close (when no
output was, an empty ``SessionMessage`` is sent: on a dropped connection the send waits for
the cancel). A session idle for ``evergreen.idle_timeout_s`` (nothing received, nothing
read, no action of its own under way) ends ``DEADLINE_EXCEEDED`` and its run ``cancelled``;
one whose client stopped reading ends at once, its status queued after what it was sent.
Requests are taken as bytes and parsed by the session (``session.py``): a malformed one is
its ``INVALID_ARGUMENT``, not grpc's INTERNAL with a traceback.
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
from orchestratord.evergreen import heap
from orchestratord.evergreen.outbox import DONE
from orchestratord.evergreen.run_body import run_body
from orchestratord.evergreen.session import Session
from orchestratord.evergreen.status import named_status, status_for
from orchestratord.flows.service import get_flow
from orchestratord.runs.routes import open_run
from orchestratord.runtime import Orchestrator

log = logging.getLogger(__name__)

SERVICE = "evergreen.v2.EvergreenService"
TRIM_AFTER_S = 1.0  # the front door idle this long: freed memory goes back to the system
ENDING_AT_ONCE = 4  # runs of ended sessions written at once (1,000 dropped together queue)
MAX_DETAILS = 2048  # characters of a status message (a trailer) and of x-error's message


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
        self._ending: set[asyncio.Task[Any]] = set()
        self._aborting: set[asyncio.Task[None]] = set()  # statuses behind unread messages
        self._empty = self.pb.evergreen_service.SessionMessage()
        self.live = 0  # sessions open
        self._ending_turns = asyncio.Semaphore(ENDING_AT_ONCE)
        self._trim: asyncio.TimerHandle | None = None

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
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        try:
            session = await self._open(context)
        except Refused as exc:
            await _abort(context, exc.status, exc.message, exc.body)
            return
        self.live += 1
        gone = True  # the client cancelled or went away (until the session ends otherwise)
        tasks: tuple[asyncio.Task[None], ...] = ()
        try:
            await context.send_initial_metadata((("x-run-id", session.run_id),))
            call = asyncio.current_task()
            assert call is not None
            tasks = (
                asyncio.create_task(session.consume(requests)),
                asyncio.create_task(session.work()),
                asyncio.create_task(self._watch_idle(session, context, call)),
            )
            with self.orch.services.pacing.follow(session.run_id, session.out):
                while (message := await session.out.get()) is not DONE:
                    await _send(session, context, message)
                gone = session.failure is None and not await self._still_there(session, context)
        finally:
            for task in tasks:
                task.cancel()
            session.out.end(drop=True)  # a step waiting for room goes on (to its cancel)
            failure = session.failure
            cancelled = gone or (failure is not None and failure.cancels_run)
            ending = self._end(session, cancelled=cancelled)
            self.live -= 1
            ending.add_done_callback(self._trim_when_idle)
        await asyncio.shield(ending)  # the run's end is written before the call's
        if gone:  # no status reaches it: the call ends quietly
            await _abort_quietly(context, grpc.StatusCode.CANCELLED, "the client went away", {})
        elif failure is not None:
            await _abort(context, named_status(failure.code), failure.message, failure.body)

    async def _still_there(self, session: Session, context: grpc.aio.ServicerContext) -> bool:
        """Whether the client is still there after its messages ended: grpc tells a dropped
        connection's end of messages as a half-close, and its cancel of the call may come
        later. A message sent after the end proves it (the stream of a dropped connection is
        closed by then); when none was, an empty ``SessionMessage`` is."""
        if session.sent_after_half_close:
            return True
        try:
            await context.write(self._empty)
        except Exception:  # the stream is closed: the peer went away
            return False
        return True

    async def _watch_idle(
        self, session: Session, context: grpc.aio.ServicerContext, call: asyncio.Task[Any]
    ) -> None:
        """End the session once it has waited on its client ``evergreen.idle_timeout_s``."""
        timeout = self.orch.settings.evergreen.idle_timeout_s
        clock = asyncio.get_running_loop().time
        while True:
            await asyncio.sleep(max(session.last_active + timeout - clock(), 0.0))
            if clock() - session.last_active < timeout:
                continue
            if not session.waits_on_client:  # an action of its own is under way
                session.touch()
                continue
            message = (
                f"session idle for {timeout:g} s (evergreen.idle_timeout_s): the client sent"
                " nothing and read nothing; its run is cancelled"
            )
            body = {
                "code": "DEADLINE_EXCEEDED",
                "message": message,
                "details": {"limit": "evergreen.idle_timeout_s", "value": timeout},
            }
            log.info("evergreen session of run %s: %s", session.run_id, message)
            session.fail("DEADLINE_EXCEEDED", message, body, cancels_run=True)
            if session.sending:
                # blocked on a client that does not read: the status follows what it was
                # sent, and the call ends now
                status = grpc.StatusCode.DEADLINE_EXCEEDED
                aborting = asyncio.create_task(_abort_quietly(context, status, message, body))
                self._aborting.add(aborting)
                aborting.add_done_callback(self._aborting.discard)
                await asyncio.sleep(0)  # the status is on its way before the call ends
                call.cancel()
            return

    def _end(self, session: Session, *, cancelled: bool) -> asyncio.Task[None]:
        """The session's run ends (a task of its own: a cancelled call cannot stop it). A few
        at a time: sessions dropped together would otherwise hold the loop with their ends."""

        async def end() -> None:
            async with self._ending_turns:
                await asyncio.sleep(0)  # a turn of the loop between ends (SQLite's are sync)
                await session.end_run(cancelled=cancelled)

        task = asyncio.get_running_loop().create_task(end())
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
        return task

    def _trim_when_idle(self, _: object = None) -> None:
        """Once no session is open (and none opened for ``TRIM_AFTER_S``), hand the memory
        the sessions freed back to the system (``heap.py``)."""
        if self._trim is not None:
            self._trim.cancel()
            self._trim = None
        if self.live:
            return
        loop = asyncio.get_running_loop()

        def trim() -> None:
            self._trim = None
            if not self.live:
                task = loop.create_task(asyncio.to_thread(heap.trim))
                self._ending.add(task)
                task.add_done_callback(self._ending.discard)

        self._trim = loop.call_later(TRIM_AFTER_S, trim)

    async def _wait_ended(self) -> None:
        if self._ending:
            await asyncio.gather(*list(self._ending), return_exceptions=True)

    async def aclose(self) -> None:
        await self._wait_ended()


async def _send(session: Session, context: grpc.aio.ServicerContext, message: Any) -> None:
    """One message to the client, once it takes it (flow control)."""
    session.sending = True
    await context.write(message)
    session.sending = False
    session.touch()
    if session.half_closed_at is not None:
        session.sent_after_half_close = True


def _cut(text: str) -> str:
    return text if len(text) <= MAX_DETAILS else text[:MAX_DETAILS] + "..."


async def _abort(
    context: grpc.aio.ServicerContext, status: grpc.StatusCode, message: str, body: dict[str, Any]
) -> None:
    if isinstance(body.get("message"), str):
        body = {**body, "message": _cut(body["message"])}
    context.set_trailing_metadata((("x-error", orjson.dumps(body).decode()),))
    await context.abort(status, _cut(message))


async def _abort_quietly(
    context: grpc.aio.ServicerContext, status: grpc.StatusCode, message: str, body: dict[str, Any]
) -> None:
    """:func:`_abort` from outside the call's task (its error is what aborting raises)."""
    with contextlib.suppress(Exception):
        await _abort(context, status, message, body)


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
        server = grpc.aio.server(
            options=[("grpc.max_metadata_size", self.orch.settings.limits.max_header_bytes)]
        )
        server.add_generic_rpc_handlers((self._handlers(),))
        bound = int(server.add_insecure_port(f"{self.host}:{self.port}"))
        if bound == 0:
            raise OSError(f"evergreen: cannot listen on {self.host}:{self.port}")
        await server.start()
        self._server, self.port = server, bound
        log.info("evergreen front door on %s:%d", self.host, bound)
        return bound

    def _handlers(self) -> grpc.GenericRpcHandler:
        """``StartSession``, its requests handed over as the bytes that came: the session
        parses them, so a malformed one is its ``INVALID_ARGUMENT``, not grpc's INTERNAL."""
        messages = self.service.pb.evergreen_service.SessionMessage
        start = grpc.stream_stream_rpc_method_handler(
            self.service.StartSession,
            request_deserializer=None,
            response_serializer=messages.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"StartSession": start})

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.stop(grace_s)
        await self.service.aclose()
