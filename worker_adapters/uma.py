"""UMA Serve engines: length-prefixed JSON frames over a Unix domain socket.

One connection per request (the protocol's phase 1): the adapter connects, sends one request
frame and reads ``token`` events until ``eos`` or ``error``, after which the engine closes the
socket. Chat messages are sent as ``request.rendered_prompt()``. ``seed`` is sent as an extra
request field (the protocol ignores fields it does not implement; the reference runtime honours
it). The protocol has no stop strings, so they are matched here; on a match the adapter sends
``cancel`` and ends with ``stop_reason="stop"``. ``eos`` reasons read ``stop`` -> ``eos`` and
``length`` -> ``length``. Token counts come from the ``eos`` event's optional
``prompt_tokens`` / ``completion_tokens``; without them ``tokens_out`` counts the token events
and ``tokens_in`` is 0.

``cancel(request_id)`` sends ``{"event": "cancel", "id": ...}`` on that request's connection;
the stream yields nothing more and ends, without a Finish, once the engine closes the socket
(which is cut after ``cancel_grace_s`` otherwise). Closing the iterator early sends the same
frame and closes the socket. ``health`` and ``capabilities`` ask for the ``metrics`` snapshot,
on a connection of its own that the engine closes after answering.

Socket errors never leave this module; error events map as in :func:`error_for_code`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable
from worker_adapters.registry import EngineDefaults, EngineVariant, ReplicaConfig, UrlForms
from worker_adapters.stops import StopMatcher
from worker_adapters.uma_frames import (
    DEFAULT_MAX_FRAME_BYTES,
    E_LIMIT_PROMPT_TOO_LARGE,
    E_PROTO_BAD_REQUEST,
    E_PROTO_FRAME_TOO_LARGE,
    E_PROTO_INVALID_JSON,
    E_RUNTIME_BUSY,
    E_RUNTIME_DECODE,
    E_RUNTIME_RESOURCE_EXHAUSTED,
    FrameError,
    FrameStream,
    encode_frame,
)

PROTOCOL = "uma-json-v1"
_REASONS = {"stop": "eos", "length": "length"}
# code -> (error class, retriable); codes not listed go by their family prefix
_ERRORS: dict[str, tuple[type[AdapterError], bool]] = {
    E_PROTO_FRAME_TOO_LARGE: (EngineFailure, False),
    E_PROTO_INVALID_JSON: (EngineFailure, False),
    E_PROTO_BAD_REQUEST: (EngineFailure, False),
    E_LIMIT_PROMPT_TOO_LARGE: (EngineFailure, False),
    # the engine failed, not the request: another attempt or replica can succeed
    E_RUNTIME_DECODE: (EngineFailure, True),
    E_RUNTIME_BUSY: (AdapterError, True),
    E_RUNTIME_RESOURCE_EXHAUSTED: (AdapterError, True),
}


def error_for_code(code: str, message: str) -> AdapterError:
    """The project's error for an engine ``error`` event.

    Request errors (``E_PROTO_*``, ``E_LIMIT_*``) are not retriable: the same request fails
    again. Busy and resource refusals are retriable ``AdapterError``; other ``E_RUNTIME_*``
    codes are retriable ``EngineFailure``; a code of any other family is not retriable.
    """
    text = f"uma engine answered {code}: {message}"
    known = _ERRORS.get(code)
    if known is not None:
        cls, retriable = known
        return cls(text, retriable=retriable)
    return EngineFailure(text, retriable=code.startswith("E_RUNTIME_"))


class _Connection:
    """One request's socket; ``cancel`` may be called from another task."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_bytes: int
    ) -> None:
        self.frames = FrameStream(reader.read, max_frame_bytes=max_frame_bytes)
        self._writer = writer
        self._abort: asyncio.TimerHandle | None = None
        self.finished = False  # the engine sent eos or error, or closed the socket
        self.cancelled = False

    async def send(self, frame: bytes) -> None:
        self._writer.write(frame)
        await self._writer.drain()

    async def cancel(self, request_id: str, grace_s: float) -> None:
        """Best effort: the engine may already have finished and closed the socket. The
        socket is cut after ``grace_s`` unless the engine closed it by then."""
        if self.cancelled:
            return
        self.cancelled = True
        loop = asyncio.get_running_loop()
        self._abort = loop.call_later(grace_s, self._writer.transport.abort)
        with contextlib.suppress(OSError, RuntimeError):
            await self.send(encode_frame({"event": "cancel", "id": request_id}))

    async def close(self) -> None:
        if self._abort is not None:
            self._abort.cancel()
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


class UmaAdapter(WorkerAdapter):
    kind = "uma"

    def __init__(
        self,
        *,
        socket_path: str | Path,
        model: str,
        context_size: int = 0,
        model_hash: str | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        cancel_grace_s: float = 2.0,
    ) -> None:
        self.socket_path = str(socket_path)
        self.model = model
        self._context_size = context_size
        self._pinned_hash = model_hash
        self._max_frame_bytes = max_frame_bytes
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._cancel_grace_s = cancel_grace_s
        self._open: dict[str, _Connection] = {}
        self._caps: Capabilities | None = None

    def __repr__(self) -> str:
        return f"UmaAdapter(socket_path={self.socket_path!r}, model={self.model!r})"

    def _request_frame(self, request: GenerationRequest) -> bytes:
        payload = {
            "id": request.request_id,
            "prompt": request.rendered_prompt(),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "stream": True,
            "seed": request.seed,
        }
        try:
            return encode_frame(payload, max_frame_bytes=self._max_frame_bytes)
        except FrameError as exc:
            raise EngineFailure(f"request not sent: {exc}") from exc

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except (OSError, TimeoutError) as exc:
            raise EngineUnavailable(
                f"cannot connect to uma engine at {self.socket_path}: {type(exc).__name__}"
            ) from exc
        return _Connection(reader, writer, self._max_frame_bytes)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        rid = request.request_id
        frame = self._request_frame(request)
        conn = await self._connect()
        self._open[rid] = conn
        try:
            with contextlib.suppress(OSError):
                # an engine refusing the request may close before reading all of it; its
                # error event is still readable
                await conn.send(frame)
            matcher = StopMatcher(request.stop)
            sent = 0
            while True:
                event = await self._next(conn)
                if conn.cancelled:
                    await self._drain_after_cancel(conn, event)
                    return
                kind = event.get("event")
                if kind == "token":
                    for token in matcher.push(_token(event)):
                        sent += 1
                        yield token
                    if matcher.stopped:
                        await conn.cancel(rid, self._cancel_grace_s)
                        reason, counts = "stop", {}
                        break
                elif kind == "eos":
                    conn.finished = True
                    reason, counts = _eos_reason(event), event
                    break
                elif kind == "error":
                    conn.finished = True
                    raise error_for_code(str(event.get("code")), str(event.get("message", "")))
                else:
                    raise EngineFailure(f"uma engine sent an unknown event {kind!r}")
            for token in matcher.flush():
                sent += 1
                yield token
            yield Finish(
                stop_reason=reason,
                tokens_in=_count(counts, "prompt_tokens", 0),
                tokens_out=sent if reason == "stop" else _count(counts, "completion_tokens", sent),
            )
        finally:
            self._open.pop(rid, None)
            if not conn.finished:
                await conn.cancel(rid, self._cancel_grace_s)
            await conn.close()

    async def _next(self, conn: _Connection) -> dict[str, Any]:
        """The next event; a cut stream is an error unless the request was cancelled."""
        event: dict[str, Any] | None
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the task's
            # cancellation when a frame arrives at the same moment (CPython gh-86296), and
            # the step's cancel would then never reach the engine
            async with asyncio.timeout(self._read_timeout_s):
                event = await conn.frames.next()
        except FrameError as exc:
            raise EngineFailure(f"uma engine broke the framing: {exc}") from exc
        except TimeoutError as exc:
            raise EngineFailure(
                f"uma engine sent nothing for {self._read_timeout_s}s", retriable=True
            ) from exc
        except OSError as exc:
            if not conn.cancelled:
                raise EngineFailure(
                    f"uma connection lost: {type(exc).__name__}", retriable=True
                ) from exc
            event = None
        if event is None:
            conn.finished = True
            if not conn.cancelled:
                raise EngineFailure(
                    "uma engine closed the stream before it finished", retriable=True
                )
            return {"event": "closed"}
        return event

    async def _drain_after_cancel(self, conn: _Connection, event: dict[str, Any]) -> None:
        """Drop what the engine sent before it saw the cancel, up to its close or its last
        event (the socket is cut after ``cancel_grace_s`` in any case)."""
        with contextlib.suppress(AdapterError):
            while event.get("event") == "token":
                event = await self._next(conn)
        conn.finished = True

    async def cancel(self, request_id: str) -> None:
        conn = self._open.get(request_id)
        if conn is not None:
            await conn.cancel(request_id, self._cancel_grace_s)

    async def _metrics(self) -> dict[str, Any]:
        conn = await self._connect()
        try:
            await conn.send(encode_frame({"type": "metrics"}))
            event = await self._next(conn)
        except OSError as exc:
            raise EngineUnavailable(f"uma metrics request failed: {type(exc).__name__}") from exc
        finally:
            await conn.close()
        if event.get("event") == "error":
            raise error_for_code(str(event.get("code")), str(event.get("message", "")))
        if event.get("event") != "metrics":
            raise EngineFailure(f"uma engine answered metrics with {event.get('event')!r}")
        return event

    async def health(self) -> Health:
        try:
            snapshot = await self._metrics()
        except EngineUnavailable as exc:
            return Health(live=False, ready=False, detail=exc.message)
        except AdapterError as exc:
            return Health(live=True, ready=False, detail=exc.message)
        active = _count(snapshot, "active_sessions", 0)
        if snapshot.get("ready") is False:  # an optional field: absent reads as ready
            return Health(live=True, ready=False, detail=str(snapshot.get("detail", "not ready")))
        return Health(live=True, ready=True, detail=f"active_sessions={active}")

    async def capabilities(self) -> Capabilities:
        if self._caps is not None:
            return self._caps
        snapshot = await self._metrics()
        reported = snapshot.get("features")
        features = [f for f in reported if isinstance(f, str)] if isinstance(reported, list) else []
        model_hash = self._pinned_hash or snapshot.get("model_hash")
        if not isinstance(model_hash, str) or not model_hash:
            # without a hash from the engine or the settings, the names identify the model
            identity = {"engine": "uma", "model": self.model, "runtime": snapshot.get("model")}
            text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
            model_hash = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        self._caps = Capabilities(
            engine="uma",
            engine_version=_text(snapshot, "engine_version") or PROTOCOL,
            model=self.model,
            model_hash=model_hash,
            context_size=_count(snapshot, "context_size", self._context_size),
            quantization=_text(snapshot, "quantization"),
            features=tuple(dict.fromkeys(["stop", "token_ids", "cancel", *features])),
            extra={
                "protocol": PROTOCOL,
                "socket_path": self.socket_path,
                "max_frame_bytes": self._max_frame_bytes,
                "runtime_engine": _text(snapshot, "engine"),
                "runtime_model": _text(snapshot, "model"),
            },
        )
        return self._caps

    async def aclose(self) -> None:
        for rid, conn in list(self._open.items()):
            await conn.cancel(rid, self._cancel_grace_s)
            await conn.close()
        self._open.clear()


def _token(event: dict[str, Any]) -> Token:
    text = event.get("text")
    if not isinstance(text, str):
        raise EngineFailure(f"uma token event without text: {event!r}"[:200])
    token_id = event.get("token_id")
    valid_id = isinstance(token_id, int) and not isinstance(token_id, bool)
    return Token(text=text, token_id=token_id if valid_id else None)


def _eos_reason(event: dict[str, Any]) -> str:
    reason = event.get("reason")
    if reason == "error":
        raise EngineFailure("uma engine ended the stream with reason error", retriable=True)
    if not isinstance(reason, str) or reason not in _REASONS:
        raise EngineFailure(f"uma engine sent an unknown eos reason {reason!r}")
    return _REASONS[reason]


def _count(fields: dict[str, Any], key: str, default: int) -> int:
    value = fields.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def _text(fields: dict[str, Any], key: str) -> str | None:
    value = fields.get(key)
    return value if isinstance(value, str) and value else None


class UmaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    context_size: int = Field(
        default=0, description="context size to report when the engine's metrics give none"
    )
    model_hash: str | None = Field(
        default=None, description="the model's hash as provenance names it; default: derived"
    )
    read_timeout_s: float = Field(default=60.0, description="seconds to wait for each frame")


def socket_path(url: str) -> str:
    """``unix:///run/uma.sock``, ``unix:/run/uma.sock`` or a bare path -> the path."""
    return url.removeprefix("unix://").removeprefix("unix:")


def _build(replica: ReplicaConfig, options: UmaOptions, defaults: EngineDefaults) -> UmaAdapter:
    return UmaAdapter(
        socket_path=replica.required_address,
        model=replica.model or "uma",
        context_size=options.context_size,
        model_hash=options.model_hash,
        read_timeout_s=options.read_timeout_s,
    )


VARIANT = EngineVariant(
    adapter=UmaAdapter,
    options=UmaOptions,
    build=_build,
    url=UrlForms(
        needs="its Unix socket as url", examples=("unix:/run/uma.sock",), address=socket_path
    ),
)
