"""A reference UMA Serve runtime (framed JSON over a Unix socket) for tests and local runs.

    .venv/bin/python -m test_harness.uma_runtime --socket /tmp/uma.sock --engine sim|llama

Tests start it in-process with ``async with serve_uma(...) as runtime`` (a real Unix socket,
in a fresh temporary directory unless a path is given) and arm failures through
``runtime.faults``; ``runtime.stats`` records what the runtime saw and sent.

It keeps the protocol's rules: one request per connection; a session moves
``RECV_REQ -> PREFILL -> DECODE <-> STREAM -> DONE | ERRORED`` and any other move is refused;
an error is sent as one ``error`` event, then the socket is closed. A frame announcing more
than ``max_frame_bytes`` is refused from its header (``E_PROTO_FRAME_TOO_LARGE``), a payload
that is not JSON is ``E_PROTO_INVALID_JSON``, missing or mistyped fields
``E_PROTO_BAD_REQUEST``, a prompt over ``max_prompt_bytes`` (UTF-8) ``E_LIMIT_PROMPT_TOO_LARGE``,
an engine failure ``E_RUNTIME_DECODE``. A second request while one is in flight, on the same
connection or beyond ``slots`` generations at once, is ``E_RUNTIME_BUSY``. ``cancel`` for the
request in flight stops it at the next token boundary and the socket is closed without an
``eos``; a client that goes away cancels as well. ``{"type": "metrics"}`` answers one snapshot
and closes. A connection that sends no whole frame within ``idle_timeout_s`` is closed.

Tokens come from the project's engines (the deterministic sim, or the local model); the
optional request field ``seed`` seeds them, so a request gives the engine's own output for
the same prompt, sampling parameters and seed. ``stream: false`` is accepted and streamed all
the same, which the protocol allows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import os
import secrets
import shutil
import signal
import stat
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from worker_adapters.base import Finish, GenerationRequest, Token, WorkerAdapter
from worker_adapters.errors import AdapterError
from worker_adapters.sim import SimAdapter
from worker_adapters.uma_frames import (
    DEFAULT_MAX_FRAME_BYTES,
    E_LIMIT_PROMPT_TOO_LARGE,
    E_PROTO_BAD_REQUEST,
    E_RUNTIME_BUSY,
    E_RUNTIME_DECODE,
    FrameError,
    FrameStream,
    encode_frame,
)

_UMA_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


class SessionState(enum.Enum):
    RECV_REQ = "recv_req"
    PREFILL = "prefill"
    DECODE = "decode"
    STREAM = "stream"
    DONE = "done"
    ERRORED = "errored"


_END = {SessionState.DONE, SessionState.ERRORED}
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.RECV_REQ: frozenset({SessionState.PREFILL, *_END}),
    SessionState.PREFILL: frozenset({SessionState.DECODE, *_END}),
    SessionState.DECODE: frozenset({SessionState.STREAM, *_END}),
    SessionState.STREAM: frozenset({SessionState.DECODE, *_END}),
    SessionState.DONE: frozenset(),
    SessionState.ERRORED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


class SessionMachine:
    """A session's state; a move that ``TRANSITIONS`` does not allow is refused."""

    def __init__(self) -> None:
        self.state = SessionState.RECV_REQ

    def advance(self, to: SessionState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.state.value} -> {to.value}")
        self.state = to


class Refusal(Exception):
    """A request answered with an ``error`` event."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class RuntimeConfig:
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_prompt_bytes: int = 256 * 1024
    max_tokens_default: int = 256
    slots: int = 8
    idle_timeout_s: float = 30.0


@dataclass
class _Failure:
    code: str
    message: str
    after_tokens: int | None
    remaining: int


@dataclass
class Faults:
    """Failures a test arms; each hits the next requests that reach it."""

    delay_s: float = 0.0  # slept before every token is sent
    _failures: list[_Failure] = field(default_factory=list)
    _cuts: dict[int, int] = field(default_factory=dict)  # after_tokens -> requests left
    _holds: dict[int, asyncio.Event] = field(default_factory=dict)

    def fail_next(
        self, count: int, code: str, *, message: str = "", after_tokens: int | None = None
    ) -> None:
        """Answer ``count`` requests with ``code``: before generating, or once ``after_tokens``
        tokens were sent."""
        text = message or f"injected {code}"
        self._failures.append(_Failure(code, text, after_tokens, count))

    def close_after(self, tokens: int, count: int = 1) -> None:
        """Cut the socket, with no event, after ``tokens`` tokens of the next ``count`` requests."""
        self._cuts[tokens] = self._cuts.get(tokens, 0) + count

    def hold(self, after_tokens: int) -> asyncio.Event:
        """Streams pause after ``after_tokens`` tokens until the returned event is set."""
        event = asyncio.Event()
        self._holds[after_tokens] = event
        return event

    def take_failure(self, after_tokens: int | None) -> _Failure | None:
        for failure in self._failures:
            if failure.after_tokens == after_tokens and failure.remaining > 0:
                failure.remaining -= 1
                return failure
        return None

    def hold_after(self, sent: int) -> asyncio.Event | None:
        return self._holds.get(sent)

    def take_cut(self, sent: int) -> bool:
        if self._cuts.get(sent, 0) > 0:
            self._cuts[sent] -= 1
            return True
        return False


@dataclass
class Stats:
    """What the runtime saw and did, for tests and the metrics snapshot."""

    requests: list[dict[str, Any]] = field(default_factory=list)  # accepted request frames
    outcomes: dict[str, str] = field(default_factory=dict)  # id -> eos:R | error:C | cancelled…
    cancels: list[str] = field(default_factory=list)  # ids cancelled while in flight
    errors: list[str] = field(default_factory=list)  # codes of the error events sent
    tokens_sent: dict[str, int] = field(default_factory=dict)
    prefill_tokens_total: int = 0
    tokens_generated_total: int = 0
    active_sessions: int = 0
    generating: int = 0
    final_states: list[SessionState] = field(default_factory=list)  # per closed session


def parse_request(frame: dict[str, Any], config: RuntimeConfig) -> GenerationRequest:
    """The generation a request frame asks for; fields the protocol does not know are ignored."""
    rid, prompt = frame.get("id"), frame.get("prompt")
    if not isinstance(rid, str) or not rid:
        raise Refusal(E_PROTO_BAD_REQUEST, "id must be a non-empty string")
    if not isinstance(prompt, str):
        raise Refusal(E_PROTO_BAD_REQUEST, "prompt must be a string")
    max_tokens = _field(frame, "max_tokens", int, config.max_tokens_default)
    temperature = _field(frame, "temperature", float, 0.0)
    top_p = _field(frame, "top_p", float, 1.0)
    top_k = _field(frame, "top_k", int, 0)
    seed = _field(frame, "seed", int, None)
    if max_tokens < 0 or temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise Refusal(E_PROTO_BAD_REQUEST, "max_tokens, temperature, top_p or top_k out of range")
    for name, kind in (("stream", bool), ("slo", dict), ("metadata", dict)):
        if name in frame and not isinstance(frame[name], kind):
            raise Refusal(E_PROTO_BAD_REQUEST, f"{name} must be a {kind.__name__}")
    size = len(prompt.encode("utf-8"))
    if size > config.max_prompt_bytes:
        raise Refusal(
            E_LIMIT_PROMPT_TOO_LARGE,
            f"prompt of {size} bytes; the limit is {config.max_prompt_bytes}",
        )
    return GenerationRequest(
        request_id=rid,
        prompt=prompt,
        messages=None,
        seed=seed if seed is not None else secrets.randbits(63),
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
    )


def _field(frame: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    if name not in frame:
        return default
    value = frame[name]
    numeric = isinstance(value, int | float) if kind is float else isinstance(value, int)
    if not numeric or isinstance(value, bool):
        raise Refusal(
            E_PROTO_BAD_REQUEST, f"{name} must be {'a number' if kind is float else 'an integer'}"
        )
    return kind(value)


class UmaSession:
    """One connection: at most one request, then the socket is closed."""

    def __init__(
        self, runtime: UmaRuntime, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.runtime = runtime
        self.frames = FrameStream(reader.read, max_frame_bytes=runtime.config.max_frame_bytes)
        self.writer = writer
        self.machine = SessionMachine()
        self.advance = self.machine.advance
        self.request_id = ""
        self.stop = asyncio.Event()  # the request in flight must end at the next token
        self.ending: str | None = None  # why it ends: "cancelled" | "disconnected" | "error"
        self.refusal: tuple[str, Refusal] | None = None  # (id, error) to answer with

    async def send(self, payload: dict[str, Any]) -> bool:
        """False once the client is gone."""
        try:
            self.writer.write(encode_frame(payload))
            await self.writer.drain()
        except OSError:
            return False
        return True

    async def refuse(self, rid: str, refusal: Refusal) -> None:
        self.advance(SessionState.ERRORED)
        self.runtime.stats.errors.append(refusal.code)
        if rid:
            self.runtime.stats.outcomes[rid] = f"error:{refusal.code}"
        await self.send(
            {"id": rid, "event": "error", "code": refusal.code, "message": refusal.message}
        )

    async def serve(self) -> None:
        config = self.runtime.config
        try:
            async with asyncio.timeout(config.idle_timeout_s):
                frame = await self.frames.next()
            while frame is not None and frame.get("event") == "cancel":
                frame = await self.frames.next()  # nothing in flight to cancel
        except FrameError as exc:
            await self.refuse("", Refusal(exc.code, exc.message))
            return
        except (TimeoutError, OSError):  # idle, or the client went away
            self.advance(SessionState.DONE)
            return
        if frame is None:
            self.advance(SessionState.DONE)
        elif frame.get("type") == "metrics" or frame.get("event") == "metrics":
            await self.send(await self.runtime.metrics())
            self.advance(SessionState.DONE)
        else:
            rid = frame.get("id")
            try:
                request = parse_request(frame, config)
            except Refusal as refusal:
                await self.refuse(rid if isinstance(rid, str) else "", refusal)
                return
            self.request_id = request.request_id
            self.runtime.stats.requests.append(frame)
            await self.generate(request)

    async def generate(self, request: GenerationRequest) -> None:
        runtime, rid = self.runtime, request.request_id
        if runtime.stats.generating >= runtime.config.slots:
            await self.refuse(rid, Refusal(E_RUNTIME_BUSY, "every slot is generating"))
            return
        failure = runtime.faults.take_failure(None)
        if failure is not None:
            await self.refuse(rid, Refusal(failure.code, failure.message))
            return
        self.advance(SessionState.PREFILL)
        watcher = asyncio.create_task(self.watch())
        runtime.stats.generating += 1
        try:
            finish = await self.decode(request)
        except AdapterError as exc:
            self.refusal = (rid, Refusal(E_RUNTIME_DECODE, exc.message))
            finish = None
        finally:
            runtime.stats.generating -= 1
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if self.refusal is None and self.ending is None and finish is None:
            self.refusal = (rid, Refusal(E_RUNTIME_DECODE, "the engine stopped without finishing"))
        if self.refusal is not None:
            await self.refuse(*self.refusal)
        elif self.ending is not None:
            runtime.stats.outcomes[rid] = self.ending
            self.advance(SessionState.DONE)
        else:
            assert finish is not None
            reason = _UMA_REASONS[finish.stop_reason]
            eos: dict[str, Any] = {"id": rid, "event": "eos", "reason": reason}
            eos |= {"prompt_tokens": finish.tokens_in, "completion_tokens": finish.tokens_out}
            await self.send(eos)
            runtime.stats.outcomes[rid] = f"eos:{reason}"
            self.advance(SessionState.DONE)

    async def decode(self, request: GenerationRequest) -> Finish | None:
        """Stream the engine's tokens until it finishes or the request must end."""
        runtime, rid = self.runtime, request.request_id
        self.advance(SessionState.DECODE)
        runtime.stats.tokens_sent[rid] = 0
        events = cast(AsyncGenerator[Token | Finish, None], runtime.engine.stream(request))
        async with contextlib.aclosing(events):
            async for event in events:
                if self.stop.is_set():
                    return None
                if isinstance(event, Finish):
                    runtime.stats.prefill_tokens_total += event.tokens_in
                    return event
                self.advance(SessionState.STREAM)
                frame: dict[str, Any] = {"id": rid, "event": "token", "text": event.text}
                if event.token_id is not None:
                    frame["token_id"] = event.token_id
                if not await self.send(frame):
                    self.end("disconnected")
                    return None
                runtime.stats.tokens_sent[rid] += 1
                runtime.stats.tokens_generated_total += 1
                self.advance(SessionState.DECODE)
                if not await self.after_token(runtime.stats.tokens_sent[rid]):
                    return None
        return None

    async def after_token(self, sent: int) -> bool:
        """Faults due after ``sent`` tokens; False when the request must end."""
        faults = self.runtime.faults
        if faults.take_cut(sent):
            self.writer.transport.abort()
            self.end("cut")
            return False
        failure = faults.take_failure(sent)
        if failure is not None:
            self.refusal = (self.request_id, Refusal(failure.code, failure.message))
            return False
        hold = faults.hold_after(sent)
        if hold is not None:
            await self.wait_unless_stopped(hold.wait())
        if faults.delay_s:
            await self.wait_unless_stopped(asyncio.sleep(faults.delay_s))
        return not self.stop.is_set()

    async def wait_unless_stopped(self, awaitable: Awaitable[Any]) -> None:
        waiters = {asyncio.ensure_future(awaitable), asyncio.ensure_future(self.stop.wait())}
        _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def end(self, why: str) -> None:
        if self.ending is None:
            self.ending = why
        self.stop.set()

    async def watch(self) -> None:
        """Frames that arrive while the request runs: its cancel, or what ends the session."""
        while True:
            try:
                frame = await self.frames.next()
            except FrameError as exc:
                self.refusal = (self.request_id, Refusal(exc.code, exc.message))
                self.end("error")
                return
            except OSError:
                frame = None
            if frame is None:
                self.end("disconnected")
                return
            if frame.get("event") == "cancel":
                if frame.get("id") == self.request_id:
                    self.runtime.stats.cancels.append(self.request_id)
                    self.end("cancelled")
                    return
                continue  # best effort: not the request in flight
            rid = frame.get("id")
            busy = Refusal(E_RUNTIME_BUSY, "a request is in flight on this session")
            self.refusal = (rid if isinstance(rid, str) else "", busy)
            self.end("error")
            return


class UmaRuntime:
    def __init__(self, engine: WorkerAdapter, config: RuntimeConfig) -> None:
        self.engine = engine
        self.config = config
        self.faults = Faults()
        self.stats = Stats()
        self.sessions: set[asyncio.Task[None]] = set()
        self.socket_path = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.sessions.add(task)
        self.stats.active_sessions += 1
        session = UmaSession(self, reader, writer)
        try:
            await session.serve()
        finally:
            self.stats.final_states.append(session.machine.state)
            self.stats.active_sessions -= 1
            self.sessions.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def metrics(self) -> dict[str, Any]:
        stats = self.stats
        snapshot: dict[str, Any] = {
            "event": "metrics",
            "tokens_generated_total": stats.tokens_generated_total,
            "prefill_tokens_total": stats.prefill_tokens_total,
            "requests_total": len(stats.requests),
            "errors_total": len(stats.errors),
            "cancels_total": len(stats.cancels),
            "active_sessions": stats.active_sessions,
            "generating": stats.generating,
            "slots": self.config.slots,
            "max_frame_bytes": self.config.max_frame_bytes,
            "features": ["seed"],
        }
        try:
            caps = await self.engine.capabilities()
        except AdapterError as exc:
            return snapshot | {"ready": False, "detail": exc.message}
        return snapshot | {
            "ready": True,
            "engine": caps.engine,
            "engine_version": f"uma-reference ({caps.engine} {caps.engine_version})",
            "model": caps.model,
            "model_hash": caps.model_hash,
            "context_size": caps.context_size,
            "quantization": caps.quantization,
        }

    async def settle(self) -> None:
        """Wait until every open session has ended."""
        while self.sessions:
            await asyncio.gather(*list(self.sessions), return_exceptions=True)


@contextlib.asynccontextmanager
async def serve_uma(
    *,
    engine: WorkerAdapter | None = None,
    socket_path: str | Path | None = None,
    config: RuntimeConfig | None = None,
) -> AsyncIterator[UmaRuntime]:
    """Serve until the block ends; ``runtime.socket_path`` is where it listens."""
    engine = engine or SimAdapter(tokens_per_s=0)
    runtime = UmaRuntime(engine, config or RuntimeConfig())
    path, tmpdir = _socket_path(socket_path)
    await engine.start()
    server = await asyncio.start_unix_server(runtime.handle, path=str(path))
    runtime.socket_path = str(path)
    try:
        yield runtime
    finally:
        server.close()
        for task in list(runtime.sessions):
            task.cancel()
        await runtime.settle()
        await server.wait_closed()
        _remove(path, tmpdir)


def _socket_path(socket_path: str | Path | None) -> tuple[Path, str | None]:
    """Where to listen, and the temporary directory made for it, if any."""
    tmpdir = None
    if socket_path is None:
        # AF_UNIX paths are short (108 bytes): a test's tmp_path can be too long
        tmpdir = tempfile.mkdtemp(prefix="uma-")
        socket_path = os.path.join(tmpdir, "uma.sock")
    path = Path(socket_path)
    if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
        path.unlink()  # a socket left by a runtime that did not stop cleanly
    return path, tmpdir


def _remove(path: Path, tmpdir: str | None) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if tmpdir is not None:
        shutil.rmtree(tmpdir, ignore_errors=True)


def make_engine(name: str, *, model_path: str | None = None) -> WorkerAdapter:
    if name == "llama":
        from worker_adapters.llama import LlamaAdapter

        return LlamaAdapter(model_path=model_path, n_ctx=2048)
    return SimAdapter(tokens_per_s=0)


async def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="test_harness.uma_runtime")
    parser.add_argument("--socket", default="/tmp/uma.sock")
    parser.add_argument("--engine", choices=("sim", "llama"), default="sim")
    parser.add_argument("--model-path", default=None, help="GGUF file (llama); default: packaged")
    parser.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES)
    parser.add_argument("--max-prompt-bytes", type=int, default=RuntimeConfig.max_prompt_bytes)
    parser.add_argument("--slots", type=int, default=RuntimeConfig.slots)
    parser.add_argument("--idle-timeout-s", type=float, default=RuntimeConfig.idle_timeout_s)
    args = parser.parse_args(argv)
    config = RuntimeConfig(
        max_frame_bytes=args.max_frame_bytes,
        max_prompt_bytes=args.max_prompt_bytes,
        slots=args.slots,
        idle_timeout_s=args.idle_timeout_s,
    )
    engine = make_engine(args.engine, model_path=args.model_path)
    try:
        async with serve_uma(engine=engine, socket_path=args.socket, config=config) as runtime:
            name = (await engine.capabilities()).model
            print(f"uma runtime ({args.engine}: {name}) on {runtime.socket_path}", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):  # either stops it and removes the socket
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(_main())
