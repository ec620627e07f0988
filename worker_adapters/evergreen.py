"""Evergreen servers (evergreen.v2, gRPC): a run's conversation kept as nodes of one session.

A replica's url is the server's gRPC address (``grpc://host:port``). With ``request.session``
(the run's) the adapter holds one Evergreen session (one ``StartSession`` call) open across
the run's steps. Each step sends one message: one ``GENERATE`` action (input ``prompt``,
output ``response``, a :data:`GenerateConfig` with the step's parameters, ``target_spec.id``
from ``options.target``) and the fragments of its new nodes. The first turn's prompt node
holds the whole prompt; a later turn's prompt node names the previous turn's prompt node and
response node by id and adds a node with only the new text, as the protocol's two-turn
example does, so the server is never sent what it already holds.

Whether a prompt extends what the session holds is a text match:

- a plain prompt (``request.prompt``) must begin with the previous prompt's text followed by
  the previous response's text; the rest is sent as one ``text/plain`` leaf;
- a chat (``request.messages``) must begin with the previous prompt's messages followed by an
  ``assistant`` message whose content is the previous response's text; each further message
  is sent as a leaf with its role (``assistant`` as ``model``), each followed by an
  ``EndOfTurn`` leaf (one node, sent once per session and named wherever a turn ends).

The response node is named only where the server reads it as meant: in a chat when its
role is ``model`` (or ``assistant``), in a plain prompt when it has no role; else its text is
sent again in a leaf of the adapter's own. A prompt that does not extend the session (it
rewrote the past, or switched between prompt and chat) gets a new session, sent whole; so
does one after a cancelled or failed step, or once the session sat idle for
``options.idle_close_s`` (the adapter closes it; the server may end idle sessions itself: a
reused session that fails before any of its response came is replaced once). Nesting grows by
one level a turn; past :data:`MAX_NESTING` the prompt node lists the conversation's leaves
instead of naming the previous prompt.

The response's fragments are read in ``seq`` order (a repeated seq is dropped); each
fragment's text is one :class:`~worker_adapters.base.Token` (``token_id`` None), until the
fragment with ``continued`` unset. Stop strings are sent in the config and matched here too (a
match here ends the session, whose response holds more than the step's text). The protocol
tells no stop reason and no token counts: the stream ends ``length`` once ``max_tokens``
tokens came, else ``eos``; ``tokens_in`` is 0.

``cancel`` cancels the gRPC call: the server's generation stops and the session is gone (the
run's next step opens another). A session ends with the run (``close_session``: the adapter
half-closes and the server ends the call). An aborted session's status maps as
:func:`error_for_status`: ``UNAVAILABLE`` (and a server that cannot be reached within
``connect_timeout_s``) is :class:`~worker_adapters.errors.EngineUnavailable`; a status that a
retry may cure is retriable.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field

from contracts.protos import load
from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)
from worker_adapters.calls_in_flight import CallsInFlight
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable
from worker_adapters.grpc_sessions import grpc_target
from worker_adapters.registry import EngineDefaults, EngineVariant, ReplicaConfig, UrlForms
from worker_adapters.session_handle import EngineSession
from worker_adapters.stops import StopMatcher

END_OF_TURN = "application/x-protobuf; type=EndOfTurn"
TEXT = "text/plain"
MAX_NESTING = 32  # levels a prompt node may nest before it lists the conversation's leaves
_EOT_ID = "e"  # the session's one EndOfTurn node
_ROLES_SENT = {"assistant": "model"}  # a message's role as the server reads it
_MODEL_ROLES = frozenset({"model", "assistant"})
_RETRIABLE = frozenset({"RESOURCE_EXHAUSTED", "ABORTED", "DEADLINE_EXCEEDED", "CANCELLED"})
_CLOSE_WAIT_S = 5.0  # how long a closed session's server may take to end the call

Messages = tuple[tuple[str, str], ...]


def error_for_status(code: str, detail: str) -> AdapterError:
    """The project's error for the status an Evergreen session ended with (by name)."""
    message = f"evergreen server answered {code}: {detail}"
    if code == "UNAVAILABLE":
        return EngineUnavailable(message)
    return AdapterError(message, retriable=True) if code in _RETRIABLE else EngineFailure(message)


@dataclass(frozen=True)
class _Held:
    """What a session holds after a turn, and how the next prompt may name it."""

    chat: bool
    prompt_id: str
    prompt_text: str  # plain prompts: the prompt sent
    prompt_messages: Messages  # chats: the messages sent
    response_id: str
    response_text: str
    response_role: str  # as the response's metadata told it
    depth: int  # edges from the prompt node to its deepest leaf
    leaves: tuple[str, ...]  # the leaves the prompt node flattens to, in order

    def names_response(self) -> bool:
        """The server reads the response node as the conversation means it."""
        if self.chat:
            return self.response_role.lower() in _MODEL_ROLES
        return self.response_role == ""


@dataclass
class _Plan:
    """One turn's prompt node: its children, the new leaves, what it stands for."""

    prompt_id: str
    response_id: str
    children: list[str]
    leaves: list[tuple[str, str, str, bytes]]  # (id, mimetype, role, data) of new leaf nodes
    depth: int
    flat: tuple[str, ...]  # the leaves the prompt node flattens to
    text: str
    messages: Messages


@dataclass(eq=False)
class _Live:
    """One open Evergreen session: its call and what it holds."""

    session_id: str
    call: Any
    turns: int = 0
    held: _Held | None = None
    eot_sent: bool = False
    busy: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class _Gone(Exception):
    """The session's call had ended before the turn got anything back."""

    def __init__(self, error: AdapterError) -> None:
        super().__init__(error.message)
        self.error = error


class EvergreenAdapter(WorkerAdapter):
    kind = "evergreen"
    session_bound = True

    def __init__(
        self,
        *,
        target: str,
        model: str,
        target_id: str = "",
        send_seed: bool = True,
        connect_timeout_s: float = 5.0,
        idle_close_s: float = 600.0,
        context_size: int = 0,
        model_hash: str | None = None,
    ) -> None:
        self.target = target  # the gRPC address
        self.target_id = target_id  # target_spec.id
        self._model = model
        self._send_seed = send_seed
        self._connect_timeout_s = connect_timeout_s
        self._idle_close_s = idle_close_s
        self._context_size = context_size
        identity = json.dumps(
            {"engine": "evergreen", "target": target_id, "model": model}, sort_keys=True
        )
        self._model_hash = model_hash or "sha256:" + hashlib.sha256(identity.encode()).hexdigest()
        self._pb = load()
        self._channel: Any = None
        self._stub: Any = None
        self._live: dict[str, _Live] = {}  # open sessions by id
        self._calls = CallsInFlight()
        self._closing: set[asyncio.Task[None]] = set()

    # -- the channel ----------------------------------------------------------------------

    def _rpc(self) -> Any:
        if self._stub is None:  # created on first use, inside the running loop
            self._channel = grpc.aio.insecure_channel(self.target)
            self._stub = self._pb.evergreen_grpc.EvergreenServiceStub(self._channel)
        return self._stub

    async def _connected(self) -> None:
        """Return once the channel is ready; EngineUnavailable when it fails to connect or
        is not ready within ``connect_timeout_s``."""
        self._rpc()
        channel = self._channel
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout_s
        state = channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            if state in (
                grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                grpc.ChannelConnectivity.SHUTDOWN,
            ):
                raise EngineUnavailable(f"evergreen server at {self.target} cannot be reached")
            try:
                async with asyncio.timeout(max(deadline - loop.time(), 0)):
                    await channel.wait_for_state_change(state)
            except TimeoutError:
                raise EngineUnavailable(
                    f"evergreen server at {self.target} not ready within "
                    f"{self._connect_timeout_s:g} s"
                ) from None
            state = channel.get_state(try_to_connect=True)

    def _error(self, exc: Any) -> AdapterError:
        return error_for_status(exc.code().name, exc.details() or "")

    # -- sessions -------------------------------------------------------------------------

    def open_session(self) -> EngineSession:
        """A handle for a run; its Evergreen session opens when first used."""
        return EngineSession(protocol=self.kind, replica=self.target)

    async def close_session(self, session: EngineSession) -> None:
        if session.session_id is not None and session.replica == self.target:
            live = self._live.pop(session.session_id, None)
            if live is not None:
                await self._close(live)
        session.session_id = None

    async def _open(self, session: EngineSession) -> _Live:
        await self._connected()
        call = self._rpc().StartSession()
        live = _Live(session_id=f"eg-{secrets.token_hex(8)}", call=call)
        if session.session_id is not None:
            session.rebuilds += 1
        session.session_id, session.replica = live.session_id, self.target
        self._live[live.session_id] = live
        return live

    def _drop(self, live: _Live) -> None:
        """Forget the session and cancel its call (a turn that did not end cleanly)."""
        if live.timer is not None:
            live.timer.cancel()
        self._live.pop(live.session_id, None)
        live.call.cancel()

    async def _close(self, live: _Live) -> None:
        """End the session cleanly: half-close, then let the server end the call."""
        if live.timer is not None:
            live.timer.cancel()
        call = live.call
        try:
            async with asyncio.timeout(_CLOSE_WAIT_S):
                await call.done_writing()
                while await call.read() is not grpc.aio.EOF:
                    pass
        except (TimeoutError, grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass
        finally:
            call.cancel()

    def _idle_from_now(self, live: _Live) -> None:
        if live.timer is not None:
            live.timer.cancel()
        loop = asyncio.get_running_loop()
        live.timer = loop.call_later(self._idle_close_s, self._expire, live)

    def _expire(self, live: _Live) -> None:
        if live.busy or self._live.get(live.session_id) is not live:
            return
        del self._live[live.session_id]
        task = asyncio.get_running_loop().create_task(self._close(live))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # -- a turn -------------------------------------------------------------------------

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        """Generate on the run's session (without one: on a session closed afterwards)."""
        session = request.session or self.open_session()
        if session.protocol != self.kind:
            raise EngineFailure(f"a {session.protocol} session cannot be used with evergreen")
        try:
            for attempt in (1, 2):
                live = self._live.get(session.session_id or "")
                if live is not None and (session.replica != self.target or live.call.done()):
                    self._drop(live)  # the server ended it (idle, restarted)
                    live = None
                plan = None if live is None else self._plan(live, request)
                if live is not None and plan is None:  # the prompt rewrote the past
                    self._live.pop(live.session_id, None)
                    await self._close(live)
                    live = None
                if live is None:
                    live = await self._open(session)
                    plan = self._plan(live, request)
                assert plan is not None
                reused = live.turns > 0
                try:
                    async for event in self._turn(live, plan, request):
                        yield event
                    return
                except _Gone as gone:
                    if not reused or attempt == 2:
                        raise gone.error from None
        finally:
            self._calls.forget(request.request_id)
            if request.session is None and session.session_id is not None:
                await self.close_session(session)

    def _plan(self, live: _Live, request: GenerationRequest) -> _Plan | None:
        """The turn's prompt node for ``request`` on ``live``; None when the prompt does not
        extend what the session holds."""
        n = live.turns + 1
        chat = request.messages is not None
        held = live.held
        children: list[str] = []
        leaves: list[tuple[str, str, str, bytes]] = []
        flat: list[str] = []
        text = "" if chat else (request.prompt or "")
        messages: Messages = tuple((m["role"], m["content"]) for m in request.messages or ())
        new_messages = messages
        rest = text
        depth = 1

        def eot() -> None:
            if not live.eot_sent and all(leaf[0] != _EOT_ID for leaf in leaves):
                leaves.append((_EOT_ID, END_OF_TURN, "", b""))
            children.append(_EOT_ID)
            flat.append(_EOT_ID)

        if held is not None:
            if held.chat != chat:
                return None
            if chat:
                k = len(held.prompt_messages)
                reply = ("assistant", held.response_text)
                if messages[:k] != held.prompt_messages or messages[k : k + 1] != (reply,):
                    return None
                new_messages = messages[k + 1 :]
            else:
                before = held.prompt_text + held.response_text
                if not text.startswith(before):
                    return None
                rest = text[len(before) :]
            if held.depth + 1 > MAX_NESTING:  # name the leaves instead of the prompt node
                children.extend(held.leaves)
            else:
                children.append(held.prompt_id)
                depth = held.depth + 1
            flat.extend(held.leaves)
            if held.names_response():
                children.append(held.response_id)
                flat.append(held.response_id)
            elif chat:
                own = f"a{n}"
                leaves.append((own, TEXT, "model", held.response_text.encode()))
                children.append(own)
                flat.append(own)
            else:
                rest = held.response_text + rest
            if chat:
                eot()  # the model's turn ends
        if chat:
            for i, (role, content) in enumerate(new_messages):
                leaf_id = f"m{n}.{i}"
                leaves.append((leaf_id, TEXT, _ROLES_SENT.get(role, role), content.encode()))
                children.append(leaf_id)
                flat.append(leaf_id)
                eot()
        elif rest or held is None:
            leaf_id = f"t{n}"
            leaves.append((leaf_id, TEXT, "", rest.encode()))
            children.append(leaf_id)
            flat.append(leaf_id)
        return _Plan(
            prompt_id=f"p{n}",
            response_id=f"r{n}",
            children=children,
            leaves=leaves,
            depth=depth,
            flat=tuple(flat),
            text=text,
            messages=messages,
        )

    def _message(self, plan: _Plan, request: GenerationRequest) -> Any:
        ev = self._pb.evergreen
        config = self._pb.evergreen_config.GenerateConfig(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            stop=list(request.stop),
        )
        if self._send_seed:
            config.seed = request.seed
        if request.json_schema is not None:
            config.json_schema = json.dumps(request.json_schema)
        action = ev.Action(
            name="GENERATE",
            inputs=[ev.NamedParameter(name="prompt", id=plan.prompt_id)],
            outputs=[ev.NamedParameter(name="response", id=plan.response_id)],
        )
        action.configs.add().Pack(config)
        if self.target_id:
            action.target_spec.id = self.target_id
        fragments = [ev.NodeFragment(id=plan.prompt_id, child_ids=plan.children)]
        for leaf_id, mimetype, role, data in plan.leaves:
            metadata = ev.ChunkMetadata(mimetype=mimetype, role=role)
            chunk = ev.Chunk(metadata=metadata, data=data)
            fragments.append(ev.NodeFragment(id=leaf_id, chunk_fragment=chunk))
        return self._pb.evergreen_service.SessionMessage(node_fragments=fragments, actions=[action])

    async def _turn(
        self, live: _Live, plan: _Plan, request: GenerationRequest
    ) -> AsyncIterator[AdapterEvent]:
        """Send the turn and stream its response; :class:`_Gone` when the call had ended
        before anything of the response came."""
        rid = request.request_id
        call = live.call
        if live.timer is not None:
            live.timer.cancel()
        live.busy = True
        self._calls.hold(rid, call)
        matcher = StopMatcher(request.stop)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending: dict[int, Any] = {}
        parts: list[bytes] = []
        next_seq, final_seq, role = 0, None, ""
        sent = 0
        clean = False
        try:
            try:
                await call.write(self._message(plan, request))
            except asyncio.InvalidStateError:
                raise _Gone(EngineUnavailable("evergreen server ended the session")) from None
            except grpc.aio.AioRpcError as exc:
                raise _Gone(self._error(exc)) from exc
            if plan.leaves and any(leaf[0] == _EOT_ID for leaf in plan.leaves):
                live.eot_sent = True
            while final_seq is None or next_seq <= final_seq:
                try:
                    message = await call.read()
                except grpc.aio.AioRpcError as exc:
                    if next_seq == 0 and not pending:
                        raise _Gone(self._error(exc)) from exc
                    raise self._error(exc) from exc
                if message is grpc.aio.EOF:
                    ended = EngineFailure(
                        "evergreen server ended the session before the response's last fragment"
                    )
                    raise _Gone(ended) if next_seq == 0 and not pending else ended
                for fragment in message.node_fragments:
                    if fragment.id != plan.response_id:
                        continue  # another node of the server's: not this turn's
                    seq = fragment.seq
                    if seq < next_seq or seq in pending:
                        continue  # a repeated (id, seq): the first copy is kept
                    if final_seq is not None and seq > final_seq:
                        raise EngineFailure(
                            f"evergreen server sent {plan.response_id!r} seq {seq} after its"
                            f" final fragment (seq {final_seq})"
                        )
                    pending[seq] = fragment
                    if not fragment.continued:
                        final_seq = seq
                while next_seq in pending:
                    chunk = pending.pop(next_seq).chunk_fragment
                    if next_seq == 0 and chunk.HasField("metadata"):
                        mimetype = chunk.metadata.mimetype or TEXT
                        if not mimetype.lower().startswith("text/"):
                            raise EngineFailure(f"evergreen server answered {mimetype!r}")
                        role = chunk.metadata.role
                    if chunk.WhichOneof("payload") == "ref":
                        raise EngineFailure("evergreen server answered by reference (ref)")
                    parts.append(chunk.data)
                    text = decoder.decode(chunk.data, final=next_seq == final_seq)
                    next_seq += 1
                    if not text or matcher.stopped:
                        continue
                    for out in matcher.push(Token(text=text)):
                        sent += 1
                        yield out
                if matcher.stopped:
                    break  # the session's response holds more than the step's text
            for out in matcher.flush():
                sent += 1
                yield out
            if not matcher.stopped:
                response = b"".join(parts).decode("utf-8", errors="replace")
                live.held = _Held(
                    chat=request.messages is not None,
                    prompt_id=plan.prompt_id,
                    prompt_text=plan.text,
                    prompt_messages=plan.messages,
                    response_id=plan.response_id,
                    response_text=response,
                    response_role=role,
                    depth=plan.depth,
                    leaves=plan.flat,
                )
                live.turns += 1
                clean = True
            if matcher.stopped:
                reason = "stop"
            else:
                reason = "length" if sent >= request.max_tokens else "eos"
            yield Finish(stop_reason=reason, tokens_in=0, tokens_out=sent)
        except asyncio.CancelledError:
            if self._calls.cancelled_by_request(rid):
                return  # cancel(): like every adapter, the stream just ends
            raise
        finally:
            self._calls.release(rid)
            live.busy = False
            if clean and self._live.get(live.session_id) is live:
                self._idle_from_now(live)
            else:
                self._drop(live)

    async def cancel(self, request_id: str) -> None:
        self._calls.cancel(request_id)

    # -- the engine -----------------------------------------------------------------------

    async def health(self) -> Health:
        """Whether the channel gets ready within ``connect_timeout_s``."""
        try:
            await self._connected()
        except EngineUnavailable as exc:
            return Health(live=False, ready=False, detail=exc.message)
        return Health(live=True, ready=True)

    async def capabilities(self) -> Capabilities:
        features = ("seed", "stop", "sessions") if self._send_seed else ("stop", "sessions")
        return Capabilities(
            engine="evergreen",
            engine_version="evergreen.v2",
            model=self._model,
            model_hash=self._model_hash,
            context_size=self._context_size,
            features=features,
            extra={"target": self.target, "target_spec": self.target_id},
        )

    async def aclose(self) -> None:
        live, self._live = list(self._live.values()), {}
        await asyncio.gather(*(self._close(s) for s in live), return_exceptions=True)
        for task in list(self._closing):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None


class EvergreenOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str = Field(
        default="",
        description="sent as every action's target_spec.id (the server's model, agent or"
        " endpoint); empty: the server's default",
    )
    seed: bool = Field(
        default=True,
        description="send each step's seed (GenerateConfig.seed); false for a server that"
        " refuses it, and the pool then does not offer seeded sampling",
    )
    connect_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="seconds the channel may take to get ready, before a session opens and"
        " in health checks",
    )
    idle_close_s: float = Field(
        default=600.0,
        gt=0,
        description="seconds a run's session may sit idle before it is closed (the run's next"
        " step opens another and sends its whole prompt)",
    )
    context_size: int = Field(
        default=0, ge=0, description="the model's context size in tokens; 0: unknown"
    )
    model_hash: str | None = Field(
        default=None,
        description="the model's hash as provenance names it; default: derived from the"
        " model and target",
    )


def _build(
    replica: ReplicaConfig, options: EvergreenOptions, defaults: EngineDefaults
) -> EvergreenAdapter:
    return EvergreenAdapter(
        target=replica.required_address,
        model=replica.model or options.target or "default",
        target_id=options.target,
        send_seed=options.seed,
        connect_timeout_s=options.connect_timeout_s,
        idle_close_s=options.idle_close_s,
        context_size=options.context_size,
        model_hash=options.model_hash,
    )


VARIANT = EngineVariant(
    adapter=EvergreenAdapter,
    options=EvergreenOptions,
    build=_build,
    url=UrlForms(
        needs="its gRPC address as url",
        examples=("grpc://127.0.0.1:50053", "127.0.0.1:50053"),
        address=grpc_target,
    ),
)
