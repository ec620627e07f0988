"""One Evergreen session: a run, its nodes, its actions as steps, its outputs as fragments.

The session reads the client's messages as they come: fragments go to the node store
(``nodes.py``: the protocol's rules), actions to a queue. Actions run one at a time in the
order received (a step's position in its run is the order its action came in, what replay
relies on); each waits for its input nodes (bounded: ``evergreen.input_wait_s``), submits its
step as ``POST /v1/runs/{id}/steps`` does, and streams the step's tokens as fragments of its
output node: ``seq`` from 0, metadata (``text/plain``, role ``model``) on seq 0 only,
``continued`` until the last. Once done, the output is a node of the session, which later
actions may name as input.

The session ends when the client half-closes and every action has run (the run completes
``succeeded``), when anything fails (the run ends ``failed``: the session aborts with the
error's status, its body in the trailing metadata ``x-error``), or when the client cancels
or goes away (the run is cancelled, its running steps with it, into their engines).

Bounds: what the client sends is read as raw bytes and parsed here (a message that is not a
``SessionMessage`` aborts ``INVALID_ARGUMENT``); every string the session holds for it counts
in ``evergreen.max_bytes`` (``nodes.py``; an action's names, ids and configs through
:meth:`NodeStore.charge`), one id is at most ``evergreen.max_id_bytes``, and at most
``evergreen.max_pending_actions`` actions wait to run. What goes out waits in an
:class:`Outbox` of ``evergreen.max_queued_outputs`` messages: once it is full, the session's
steps wait for the client (``steps/pacing.py``). :attr:`Session.last_active` is when the
client last sent or read a message, or an action ended (the server's idle clock).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from pydantic import TypeAdapter, ValidationError

from contracts.runs import RunComplete
from contracts.steps import StepCreate
from orchestrator_core.errors import OrchestratorError
from orchestrator_core.keys import Principal
from orchestratord.evergreen import actions as acts
from orchestratord.evergreen.nodes import (
    ChunkPart,
    Fragment,
    Limits,
    NodeStore,
    SessionAbort,
    shown,
)
from orchestratord.evergreen.outbox import Outbox
from orchestratord.evergreen.refs import resolved
from orchestratord.evergreen.status import status_for
from orchestratord.runs import service as runs
from orchestratord.runtime import Orchestrator
from orchestratord.steps.queries import get_step
from orchestratord.steps.routes import submit_now
from orchestratord.streams.sse import step_events

log = logging.getLogger(__name__)

_STEP = TypeAdapter(StepCreate)
TEXT = "text/plain"


@dataclass
class Failure:
    code: str  # a gRPC status name
    message: str
    body: dict[str, Any]
    cancels_run: bool = False  # the run ends cancelled (not failed): the client left it


class Session:
    def __init__(
        self,
        orch: Orchestrator,
        pb: Any,  # contracts.protos.load()
        *,
        run_id: str,
        seed: int,
        principal: Principal | None,
        tools: Sequence[str],
        fs_policy: dict[str, Any] | None = None,
    ) -> None:
        settings = orch.settings.evergreen
        self.orch = orch
        self.pb = pb
        self.run_id = run_id
        self.principal = principal
        self.tools = tuple(tools)
        self.fs_policy = fs_policy  # where file:// references may be read (refs.py)
        self.wait_s = settings.input_wait_s
        self.max_pending = settings.max_pending_actions
        self.store = NodeStore(
            Limits(
                max_nodes=settings.max_nodes,
                max_bytes=settings.max_bytes,
                max_depth=settings.max_depth,
                max_id_bytes=settings.max_id_bytes,
            )
        )
        self.ctx = acts.PlanContext(run_seed=seed, unpack=self._unpack_config, tools=self.tools)
        self.out = Outbox(settings.max_queued_outputs)
        self._actions: asyncio.Queue[tuple[acts.ActionCall, acts.ActionKind] | None] = (
            asyncio.Queue()
        )
        self.failure: Failure | None = None
        self.running: set[str] = set()  # steps of this session not ended yet
        self._count = 0  # actions run
        self.pending = 0  # actions received and not ended
        self._clock = asyncio.get_running_loop().time
        self.last_active = self._clock()
        self.half_closed_at: float | None = None  # when the client's messages ended
        self.sending = False  # a message is handed to the client, not taken yet
        self.sent_after_half_close = False  # the client took a message after its last one

    def touch(self) -> None:
        """The client sent or read a message, or an action ended: the idle clock restarts."""
        self.last_active = self._clock()

    @property
    def waits_on_client(self) -> bool:
        """Nothing the server does is under way, or what it does waits for the client to
        read: the idle clock runs."""
        return self.sending or self.pending == 0

    def _unpack_config(self, value: bytes) -> Any:
        config = self.pb.evergreen_config.GenerateConfig()
        try:
            config.ParseFromString(value)
        except DecodeError as exc:
            raise SessionAbort(
                "INVALID_ARGUMENT", f"a config is not a valid {acts.CONFIG_TYPE}: {exc}"
            ) from None
        return config

    def _parse(self, raw: bytes) -> Any:
        """A received message: ``SessionMessage`` bytes, else the session aborts."""
        try:
            return self.pb.evergreen_service.SessionMessage.FromString(raw)
        except DecodeError as exc:
            raise SessionAbort(
                "INVALID_ARGUMENT",
                f"a message of {len(raw)} bytes is not an evergreen.v2.SessionMessage: {exc}",
            ) from None

    # -- failures ---------------------------------------------------------------------------

    def fail(
        self,
        code: str,
        message: str,
        body: dict[str, Any] | None = None,
        *,
        cancels_run: bool = False,
    ) -> None:
        """End the session with ``code`` (a gRPC status name); the first failure wins.
        ``cancels_run``: the client left (the run ends cancelled), and what waits to be sent
        is dropped."""
        if self.failure is None:
            body = body or {"code": code, "message": message}
            self.failure = Failure(code, message, body, cancels_run)
            self.out.end(drop=cancels_run)

    def _failed_by(self, exc: BaseException) -> None:
        if isinstance(exc, SessionAbort):
            log.info("evergreen session of run %s: %s: %s", self.run_id, exc.code, exc.message)
            self.fail(exc.code, exc.message)
        elif isinstance(exc, OrchestratorError):
            status = status_for(exc.code, retriable=exc.retriable)
            self.fail(status.name, exc.message, exc.body())
        elif isinstance(exc, ActionFailed):
            status = status_for(exc.body.get("code", ""), retriable=bool(exc.body.get("retriable")))
            self.fail(status.name, str(exc.body.get("message", "")), exc.body)
        else:
            log.exception("evergreen session of run %s failed", self.run_id, exc_info=exc)
            self.fail("INTERNAL", f"{type(exc).__name__}: {exc}")

    # -- reading the client ---------------------------------------------------------------

    async def consume(self, requests: AsyncIterator[bytes]) -> None:
        """The client's messages (raw bytes), until it half-closes (then the queued actions
        finish)."""
        try:
            async for raw in requests:
                self.touch()
                message = self._parse(raw)
                for fragment in message.node_fragments:
                    self.store.add(fragment_of(fragment))
                for action in message.actions:
                    self._take(_call(action))
            self.half_closed_at = self._clock()
            self._actions.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a broken rule, or the transport
            self._failed_by(exc)

    def _take(self, call: acts.ActionCall) -> None:
        """Queue a received action, its strings counted in what the session holds."""
        store = self.store
        store.check_id(call.name, "an action's name")
        what = f"action {call.name!r}"
        size = len(call.name.encode()) + store.check_id(call.target, f"{what}: target_spec.id")
        for param in (*call.inputs, *call.outputs):
            size += store.check_id(param.name, f"{what}: a parameter name")
            size += store.check_id(param.id, f"{what}: parameter {shown(param.name)}'s id")
        for type_url, value in call.configs:
            size += store.check_id(type_url, f"{what}: a config's type_url") + len(value)
        if self.pending >= self.max_pending:
            raise SessionAbort(
                "RESOURCE_EXHAUSTED",
                f"{what}: more actions waiting to run than evergreen.max_pending_actions"
                f" ({self.max_pending})",
            )
        kind = acts.kind_of(call.name, self.tools)
        output = acts.output_of(call, kind)
        if output is not None:
            store.claim_output(output.id)
            size -= len(output.id.encode())  # counted by the claim
        store.charge(size, what)
        self.pending += 1
        self._actions.put_nowait((call, kind))

    async def work(self) -> None:
        """The actions, one at a time in the order received."""
        try:
            while (item := await self._actions.get()) is not None:
                try:
                    await self._run(*item)
                finally:
                    self.pending -= 1
                    self.touch()
            self.out.end()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._failed_by(exc)

    # -- one action -----------------------------------------------------------------------

    async def _run(self, call: acts.ActionCall, kind: acts.ActionKind) -> None:
        self._count += 1
        param = acts.input_of(call, kind)
        await self.store.wait_complete([param.id], self.wait_s)
        leaves = await resolved(self.store.leaves(param.id), self.fs_policy, self.orch.services.fs)
        planned = acts.plan(call, kind, leaves, self.ctx, list(self.orch.pools.pools))
        body: dict[str, Any] = {
            "type": planned.step_type,
            "client_token": f"evergreen:{self._count}:{planned.output_id or ''}",
            "input": planned.step_input,
        }
        if planned.placement is not None:
            body["placement"] = planned.placement
        try:
            typed = _STEP.validate_python(body)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"][1:]) or "action"
            raise SessionAbort(
                "INVALID_ARGUMENT", f"action {call.name!r}: {where}: {err['msg']}"
            ) from None
        done = await submit_now(self.orch, self.run_id, typed, self.principal)
        step_id = done.step.step_id
        self.running.add(step_id)
        try:
            text = await self._follow(step_id, planned)
        finally:
            self.running.discard(step_id)
        if planned.output_id is None:
            return
        if planned.streamed:
            self.store.add_output(planned.output_id, TEXT, planned.output_role, text)
            return
        async with self.orch.db.read() as session:
            step = await get_step(session, step_id=step_id)
        data = orjson.dumps(step.output)
        await self.out.put(
            self._message(planned.output_id, 0, data, final=True, mime=acts.JSON, role="")
        )
        self.store.add_output(planned.output_id, acts.JSON, "", data)

    async def _follow(self, step_id: str, planned: acts.Planned) -> bytes:
        """The step's events to its end; its tokens streamed as fragments of the output."""
        seq = 0
        parts: list[bytes] = []
        async for batch in step_events(self.orch, step_id):
            tokens = []
            for ev in batch:
                if ev.type == "token":
                    tokens.append(orjson.loads(ev.data)["t"])
                elif ev.type == "error":
                    raise ActionFailed(orjson.loads(ev.data))
            if tokens and planned.streamed and planned.output_id is not None:
                data = "".join(tokens).encode()
                parts.append(data)
                await self.out.put(
                    self._message(
                        planned.output_id, seq, data, final=False, role=planned.output_role
                    )
                )
                seq += 1
        if planned.streamed and planned.output_id is not None:
            await self.out.put(
                self._message(planned.output_id, seq, b"", final=True, role=planned.output_role)
            )
        return b"".join(parts)

    def _message(
        self, node_id: str, seq: int, data: bytes, *, final: bool, role: str, mime: str = TEXT
    ) -> Any:
        ev = self.pb.evergreen
        chunk = ev.Chunk(data=data)
        if seq == 0:
            chunk.metadata.CopyFrom(ev.ChunkMetadata(mimetype=mime, role=role))
        fragment = ev.NodeFragment(id=node_id, seq=seq, continued=not final, chunk_fragment=chunk)
        return self.pb.evergreen_service.SessionMessage(node_fragments=[fragment])

    # -- the run's end --------------------------------------------------------------------

    async def end_run(self, *, cancelled: bool) -> None:
        """The run ends with the session: succeeded, failed, or cancelled (its steps too)."""
        orch = self.orch
        try:
            if cancelled:
                async with orch.tx() as tx:
                    _, running = await runs.cancel_run(tx, run_id=self.run_id)
                for step_id in running:
                    orch.dispatcher.cancel(step_id)
                return
            for step_id in list(self.running):
                await orch.cancel_step(step_id)
            status = "failed" if self.failure is not None else "succeeded"
            async with orch.tx() as tx:
                await runs.complete_run(tx, run_id=self.run_id, body=RunComplete(status=status))
        except OrchestratorError as exc:  # ended meanwhile (cancelled over HTTP, say)
            log.info("run %s of an evergreen session: %s", self.run_id, exc.message)


class ActionFailed(Exception):
    """A step ended with an error: its body, as its ``error`` event carries it."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("message"))
        kept = ("code", "message", "retriable", "details")
        self.body: dict[str, Any] = {k: body[k] for k in kept if k in body}


def fragment_of(f: Any) -> Fragment:
    """A received ``NodeFragment`` in plain values (``nodes.Fragment``)."""
    chunk = None
    if f.HasField("chunk_fragment"):
        c = f.chunk_fragment
        meta = c.metadata if c.HasField("metadata") else None
        which = c.WhichOneof("payload")
        chunk = ChunkPart(
            mimetype=None if meta is None else meta.mimetype,
            role=None if meta is None else meta.role,
            data=c.data if which == "data" else None,
            ref=c.ref if which == "ref" else None,
        )
    return Fragment(
        id=f.id, seq=f.seq, continued=f.continued, child_ids=tuple(f.child_ids), chunk=chunk
    )


def _call(a: Any) -> acts.ActionCall:
    return acts.ActionCall(
        name=a.name,
        inputs=tuple(acts.Param(p.name, p.id) for p in a.inputs),
        outputs=tuple(acts.Param(p.name, p.id) for p in a.outputs),
        configs=tuple((c.type_url, c.value) for c in a.configs),
        target=a.target_spec.id if a.HasField("target_spec") else "",
    )
