"""UMA framing: ``uint32_le length | JSON payload`` frames, and the protocol's error codes.

Both sides use this codec: the adapter (:mod:`worker_adapters.uma`) and the reference runtime.
The decoder takes bytes as they arrive, in chunks of any size, and gives back whole frames.
A header announcing more than ``max_frame_bytes`` is refused before its payload is read or
buffered; after that the byte stream cannot be resynchronised, so the decoder refuses
everything that follows. A payload that is not JSON (or not UTF-8) is consumed and refused
with ``E_PROTO_INVALID_JSON``, and JSON that is not an object with ``E_PROTO_BAD_REQUEST``
(every frame of the protocol carries an object); the frames after either still decode.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import orjson

DEFAULT_MAX_FRAME_BYTES = 1 << 20
HEADER = struct.Struct("<I")

# Error codes the protocol names.
E_PROTO_FRAME_TOO_LARGE = "E_PROTO_FRAME_TOO_LARGE"
E_PROTO_INVALID_JSON = "E_PROTO_INVALID_JSON"
E_PROTO_BAD_REQUEST = "E_PROTO_BAD_REQUEST"
E_LIMIT_PROMPT_TOO_LARGE = "E_LIMIT_PROMPT_TOO_LARGE"
E_RUNTIME_DECODE = "E_RUNTIME_DECODE"
# Refusals the protocol describes without naming a code: a request while the session or
# every slot of the runtime is busy, and a runtime out of memory for the request.
E_RUNTIME_BUSY = "E_RUNTIME_BUSY"
E_RUNTIME_RESOURCE_EXHAUSTED = "E_RUNTIME_RESOURCE_EXHAUSTED"

ERROR_CODES = (
    E_PROTO_FRAME_TOO_LARGE,
    E_PROTO_INVALID_JSON,
    E_PROTO_BAD_REQUEST,
    E_LIMIT_PROMPT_TOO_LARGE,
    E_RUNTIME_DECODE,
    E_RUNTIME_BUSY,
    E_RUNTIME_RESOURCE_EXHAUSTED,
)


class FrameError(Exception):
    """A frame broke the framing rules; ``code`` is the protocol's error code for it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def encode_frame(
    payload: Mapping[str, Any], *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes:
    body = orjson.dumps(payload)
    if len(body) > max_frame_bytes:
        raise FrameError(
            E_PROTO_FRAME_TOO_LARGE, f"frame of {len(body)} bytes over the cap of {max_frame_bytes}"
        )
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Reassembles frames from chunks; ``next_frame`` gives one whole frame's object or None."""

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._broken: FrameError | None = None

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        if self._broken is None:
            self._buffer += data

    def next_frame(self) -> dict[str, Any] | None:
        if self._broken is not None:
            raise self._broken
        if len(self._buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self.max_frame_bytes:
            self._broken = FrameError(
                E_PROTO_FRAME_TOO_LARGE,
                f"frame of {length} bytes announced; the cap is {self.max_frame_bytes}",
            )
            self._buffer.clear()
            raise self._broken
        end = HEADER.size + length
        if len(self._buffer) < end:
            return None
        payload = bytes(self._buffer[HEADER.size : end])
        del self._buffer[:end]
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise FrameError(E_PROTO_INVALID_JSON, f"payload is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise FrameError(
                E_PROTO_BAD_REQUEST, f"frame holds a {type(value).__name__}, not an object"
            )
        return value

    def frames(self, data: bytes) -> Iterator[dict[str, Any]]:
        """Feed ``data`` and yield every frame it completes."""
        self.feed(data)
        while (frame := self.next_frame()) is not None:
            yield frame


class FrameStream:
    """Frames from a byte source such as :meth:`asyncio.StreamReader.read`, one at a time."""

    def __init__(
        self,
        read: Callable[[int], Awaitable[bytes]],
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        chunk_bytes: int = 1 << 16,
    ) -> None:
        self._read = read
        self._chunk = chunk_bytes
        self.decoder = FrameDecoder(max_frame_bytes=max_frame_bytes)

    async def next(self) -> dict[str, Any] | None:
        """The next frame, or None once the peer closed (``decoder.pending`` tells whether it
        closed in the middle of a frame)."""
        while (frame := self.decoder.next_frame()) is None:
            chunk = await self._read(self._chunk)
            if not chunk:
                return None
            self.decoder.feed(chunk)
        return frame
