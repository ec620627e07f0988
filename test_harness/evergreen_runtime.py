"""A reference Evergreen server (evergreen.v2 over gRPC) for tests and local runs.

    .venv/bin/python -m test_harness.evergreen_runtime --port 50053 --engine sim|llama

Tests start it in-process with ``async with serve_evergreen(...) as server`` (a real localhost
gRPC server), read what it did from ``server.counters`` and ``server.sessions``, and arm
failures through ``server.faults``; ``await server.stop()`` closes it before the block ends.

One ``StartSession`` call is one session with its own node store
(``orchestratord.evergreen.nodes``: the protocol's rules on fragments, a broken one aborts
the session with its status). It runs one action, ``GENERATE``: input ``prompt`` (or
``text``), output ``response`` (or ``text``); actions run one at a time in the order
received, each once its input nodes are complete. The input is flattened into its chunks and
read as the front door reads it (``orchestratord.evergreen.prompts``): ``text/*`` chunks are
the text, ``role`` metadata makes a conversation, an ``EndOfTurn`` chunk ends a message. Its
configs are ``orchestratord.evergreen.v1.GenerateConfig`` (another type is INVALID_ARGUMENT);
without a ``seed`` one is drawn. ``target_spec.id`` must be empty or the served model
(NOT_FOUND otherwise). Another action name is INVALID_ARGUMENT.

The response streams as fragments of the output node, one per generated token (the engine's
token ids are not on the wire: tokens as text): ``seq`` from 0, metadata (``text/plain``; role
``model`` when the input was a conversation, none for a plain prompt) on seq 0 only,
``continued`` until the last fragment, which is empty. Once complete the response is a node of
the session that later inputs may name. A session idle (no message, no action running) for
``idle_ttl_s`` is aborted with DEADLINE_EXCEEDED.

The generator is a :class:`~worker_adapters.base.WorkerAdapter`: the sim engine by default
(its deterministic tokens: equal (prompt or messages, parameters, seed) give equal text), or
the llama engine (the packaged model, in-process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc  # type: ignore[import-untyped]

from contracts.protos import load
from orchestratord.evergreen.actions import config_params, known_config
from orchestratord.evergreen.nodes import Limits, NodeStore, SessionAbort
from orchestratord.evergreen.prompts import MODEL_ROLE, llm_input
from orchestratord.evergreen.session import fragment_of
from worker_adapters.base import Finish, GenerationRequest, Token, WorkerAdapter
from worker_adapters.sim import SimAdapter

TEXT = "text/plain"
DEFAULT_MAX_TOKENS = 64
_INPUTS = ("prompt", "text")
_OUTPUTS = ("response", "text")


@dataclass
class Counters:
    """What the server did since it started."""

    sessions_opened: int = 0
    actions_run: int = 0  # GENERATE actions that streamed their response to the end
    tokens_sent: int = 0  # response fragments that carried a token
    cancelled: int = 0  # calls cancelled while an action generated (by the client, or a stop)
    aborted: int = 0  # sessions the server aborted (a broken rule, a fault, idleness)


@dataclass(eq=False)
class ServedSession:
    """One StartSession call, as the server saw it."""

    number: int  # 1 for the first session the server opened
    store: NodeStore
    last_used: float
    received: list[int] = field(default_factory=list)  # bytes of each message received
    requests: list[GenerationRequest] = field(default_factory=list)  # each action's, as run
    actions: int = 0  # actions that streamed their response to the end
    busy: bool = False  # an action is running
    ended: str | None = None  # None while open; "ok", "cancelled", or "aborted CODE"
    _queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue, repr=False)

    @property
    def bytes_received(self) -> int:
        return sum(self.received)


@dataclass
class _Abort:
    code: grpc.StatusCode
    after_tokens: int
    remaining: int


@dataclass
class Faults:
    """Failures a test arms; each hits the next actions that match it."""

    delay_s: float = 0.0  # slept before each action runs
    _aborts: list[_Abort] = field(default_factory=list)
    _holds: dict[int, asyncio.Event] = field(default_factory=dict)

    def abort_after(
        self, tokens: int, code: grpc.StatusCode = grpc.StatusCode.INTERNAL, *, count: int = 1
    ) -> None:
        """The next ``count`` actions abort their session with ``code`` once they have sent
        ``tokens`` tokens (0: before the first)."""
        self._aborts.append(_Abort(code, tokens, count))

    def hold(self, after_tokens: int) -> asyncio.Event:
        """Responses pause after ``after_tokens`` tokens until the returned event is set."""
        event = asyncio.Event()
        self._holds[after_tokens] = event
        return event

    async def during(self, sent: int) -> None:
        """Raises the abort armed for a response that has sent ``sent`` tokens."""
        for failure in self._aborts:
            if failure.after_tokens == sent and failure.remaining > 0:
                failure.remaining -= 1
                name = failure.code.name
                raise SessionAbort(name, f"injected {name} after {sent} tokens")
        hold = self._holds.get(sent)
        if hold is not None:
            await hold.wait()


class _Evict:
    """Queued by the sweeper: the session has been idle too long."""


_EVICT = _Evict()


def _param(params: Any, names: tuple[str, ...], what: str, action: str) -> str | None:
    found = None
    for p in params:
        if p.name not in names:
            raise SessionAbort(
                "INVALID_ARGUMENT",
                f"action {action!r}: unknown {what} {p.name!r} (takes {', '.join(names)})",
            )
        found = p.id
    return found


class EvergreenService:
    def __init__(
        self,
        engine: WorkerAdapter,
        *,
        model: str,
        faults: Faults,
        counters: Counters,
        clock: Callable[[], float],
        input_wait_s: float,
        limits: Limits,
    ) -> None:
        self.pb = load()
        self.limits = limits
        self.engine = engine
        self.model = model
        self.faults = faults
        self.counters = counters
        self.clock = clock
        self.input_wait_s = input_wait_s
        self.sessions: list[ServedSession] = []
        self._ids = itertools.count(1)

    async def StartSession(self, requests: AsyncIterator[Any], context: Any) -> None:
        self.counters.sessions_opened += 1
        served = ServedSession(next(self._ids), NodeStore(self.limits), self.clock())
        self.sessions.append(served)
        reader = asyncio.create_task(self._read(served, requests))
        try:
            while (item := await served._queue.get()) is not None:
                if isinstance(item, SessionAbort):
                    await self._abort(served, context, grpc.StatusCode[item.code], item.message)
                elif isinstance(item, _Evict):
                    if not served.busy and served._queue.empty():
                        idle = self.clock() - served.last_used
                        await self._abort(
                            served,
                            context,
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"session idle for {idle:.1f} s",
                        )
                else:
                    await self._action(served, item, context)
            served.ended = "ok"
        except asyncio.CancelledError:
            served.ended = served.ended or "cancelled"
            raise
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _abort(
        self, served: ServedSession, context: Any, code: grpc.StatusCode, message: str
    ) -> None:
        served.ended = f"aborted {code.name}"
        self.counters.aborted += 1
        await context.abort(code, message)

    async def _read(self, served: ServedSession, requests: AsyncIterator[Any]) -> None:
        """The client's messages: fragments into the store, actions queued; then None once
        the client half-closes (a broken rule is queued as the session's end)."""
        try:
            async for message in requests:
                served.received.append(message.ByteSize())
                served.last_used = self.clock()
                for fragment in message.node_fragments:
                    served.store.add(fragment_of(fragment))
                for action in message.actions:
                    output = _param(action.outputs, _OUTPUTS, "output", action.name)
                    if output is not None:
                        served.store.claim_output(output)
                    served._queue.put_nowait(action)
        except SessionAbort as exc:
            served._queue.put_nowait(exc)
            return
        except grpc.aio.AioRpcError:  # the call ended under the reader
            return
        served._queue.put_nowait(None)

    async def _action(self, served: ServedSession, action: Any, context: Any) -> None:
        served.busy = True
        try:
            await self._generate(served, action, context)
        except SessionAbort as exc:
            await self._abort(served, context, grpc.StatusCode[exc.code], exc.message)
        except asyncio.CancelledError:  # the client cancelled the call mid-action
            served.ended = "cancelled"
            self.counters.cancelled += 1
            raise
        finally:
            served.busy = False
            served.last_used = self.clock()

    def _request(self, action: Any, prompt: dict[str, Any]) -> GenerationRequest:
        """The engine's request for ``action`` on the input read as ``prompt``."""
        params: dict[str, Any] = {"max_tokens": DEFAULT_MAX_TOKENS}
        seed: int | None = None
        for packed in action.configs:
            known_config(packed.type_url, action.name)
            config = self.pb.evergreen_config.GenerateConfig()
            config.ParseFromString(packed.value)
            params.update(config_params(config, action.name))
            if config.HasField("seed"):
                seed = config.seed
        if "stop" in params:
            params["stop"] = tuple(params["stop"])
        messages = prompt.get("messages")
        return GenerationRequest(
            request_id=secrets.token_hex(8),
            prompt=prompt.get("prompt"),
            messages=None if messages is None else tuple(messages),
            seed=secrets.randbits(63) if seed is None else seed,
            model=self.model,
            **params,
        )

    async def _generate(self, served: ServedSession, action: Any, context: Any) -> None:
        pb = self.pb
        if action.name != "GENERATE":
            raise SessionAbort(
                "INVALID_ARGUMENT", f"unknown action {action.name!r} (this server runs GENERATE)"
            )
        target = action.target_spec.id if action.HasField("target_spec") else ""
        if target not in ("", self.model):
            raise SessionAbort(
                "NOT_FOUND", f"unknown target {target!r} (this server serves {self.model!r})"
            )
        input_id = _param(action.inputs, _INPUTS, "input", action.name)
        if input_id is None:
            raise SessionAbort("INVALID_ARGUMENT", f"action {action.name!r} has no input prompt")
        output_id = _param(action.outputs, _OUTPUTS, "output", action.name)
        await served.store.wait_complete([input_id], self.input_wait_s)
        prompt = llm_input(served.store.leaves(input_id), "prompt")
        request = self._request(action, prompt)
        served.requests.append(request)
        if self.faults.delay_s:
            await asyncio.sleep(self.faults.delay_s)
        role = MODEL_ROLE if "messages" in prompt else ""
        seq = sent = 0
        parts: list[bytes] = []

        def fragment(data: bytes, *, final: bool) -> Any:
            chunk = pb.evergreen.Chunk(data=data)
            if seq == 0:
                chunk.metadata.CopyFrom(pb.evergreen.ChunkMetadata(mimetype=TEXT, role=role))
            node = pb.evergreen.NodeFragment(
                id=output_id, seq=seq, continued=not final, chunk_fragment=chunk
            )
            return pb.evergreen_service.SessionMessage(node_fragments=[node])

        await self.faults.during(0)
        stream = self.engine.stream(request)
        try:
            async for event in stream:
                if isinstance(event, Finish):
                    break
                assert isinstance(event, Token)
                if not event.text:
                    continue
                data = event.text.encode()
                parts.append(data)
                if output_id is not None:
                    await context.write(fragment(data, final=False))
                    seq += 1
                sent += 1
                self.counters.tokens_sent += 1
                await self.faults.during(sent)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        # counted before the last fragment goes out: a client that has read it may look
        served.actions += 1
        self.counters.actions_run += 1
        if output_id is not None:
            served.store.add_output(output_id, TEXT, role, b"".join(parts))
            await context.write(fragment(b"", final=True))


@dataclass
class RunningEvergreen:
    address: str  # host:port
    counters: Counters
    faults: Faults
    engine: WorkerAdapter
    service: EvergreenService
    _server: Any = field(repr=False)

    @property
    def sessions(self) -> list[ServedSession]:
        """Every session opened, in order."""
        return self.service.sessions

    @property
    def open_sessions(self) -> list[ServedSession]:
        return [s for s in self.sessions if s.ended is None]

    async def stop(self) -> None:
        """Close the server now: its sessions end, new calls find nothing listening."""
        await self._server.stop(grace=None)


def make_engine(name: str) -> WorkerAdapter:
    """The generator a server runs: ``sim`` (as fast as it goes) or ``llama`` (the packaged
    model)."""
    if name == "llama":
        from worker_adapters.llama import LlamaAdapter

        return LlamaAdapter(n_ctx=2048)
    return SimAdapter(tokens_per_s=0, eos_probability=0.02)


@contextlib.asynccontextmanager
async def serve_evergreen(
    *,
    engine: WorkerAdapter | None = None,
    model: str = "sim-1",
    host: str = "127.0.0.1",
    port: int = 0,
    idle_ttl_s: float = 1800.0,
    input_wait_s: float = 30.0,
    limits: Limits | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[RunningEvergreen]:
    """Serve an Evergreen server until the block ends; yields its address and test hooks.
    ``limits``: what one session may hold (nodes, bytes, nesting), the front door's defaults
    unless given."""
    engine = engine or make_engine("sim")
    await engine.start()
    counters, faults = Counters(), Faults()
    service = EvergreenService(
        engine,
        model=model,
        faults=faults,
        counters=counters,
        clock=clock,
        input_wait_s=input_wait_s,
        limits=limits or Limits(),
    )
    server = grpc.aio.server()
    bound = server.add_insecure_port(f"{host}:{port}")
    load().evergreen_grpc.add_EvergreenServiceServicer_to_server(service, server)
    await server.start()

    async def sweeper() -> None:
        while True:
            await asyncio.sleep(min(max(idle_ttl_s / 2, 0.02), 30.0))
            now = clock()
            for served in service.sessions:
                if served.ended is None and not served.busy and now - served.last_used > idle_ttl_s:
                    served._queue.put_nowait(_EVICT)

    task = asyncio.create_task(sweeper())
    try:
        yield RunningEvergreen(f"{host}:{bound}", counters, faults, engine, service, server)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop(grace=None)
        await engine.aclose()


async def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="test_harness.evergreen_runtime")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50053)
    parser.add_argument("--engine", choices=("sim", "llama"), default="sim")
    parser.add_argument("--model", default=None, help="the target it serves (default: sim-1)")
    parser.add_argument("--idle-ttl-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    model = args.model or ("gemma-3-270m" if args.engine == "llama" else "sim-1")
    async with serve_evergreen(
        engine=make_engine(args.engine),
        model=model,
        host=args.host,
        port=args.port,
        idle_ttl_s=args.idle_ttl_s,
    ) as server:
        print(f"evergreen server ({args.engine}) listening on {server.address}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
