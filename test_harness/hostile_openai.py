"""An OpenAI-compatible engine that misbehaves as the prompt asks, in a process of its own
(tests/adapters/test_hostile_engines.py, bench/hostile_engines.py):

    python -m test_harness.hostile_openai --port 8001

The first words of a completion's prompt (or of the last message) pick what it does (more
words after them are a name, for the counts):

- ``huge-token MB``: one token of MB megabytes, sent as it is made, then a normal end;
- ``huge-error MB``: an HTTP 500 whose body is MB megabytes;
- ``trickle S``: an event stream of ``: ping`` comments every S seconds, no token, forever;
- ``drip S``: one token every S seconds, forever;
- ``big-tokens KIB``: tokens of KIB KiB each, forever;
- ``busy STATUS TIMES SECONDS``: the first TIMES requests with this prompt are answered STATUS
  with ``Retry-After: SECONDS``, the next ones normally;
- anything else: four tokens and a normal end.

``GET /stats`` tells the requests it took per prompt and how many responses the client left
before their end. Written on raw asyncio streams, so a megabyte costs this process one write.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections import Counter
from typing import Any

MB = 1 << 20
_OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


class Engine:
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.left = 0  # responses the client closed before their end

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            method, path, body = await _request(reader)
            await self._answer(method, path, body, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.left += 1
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(
        self, method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter
    ) -> None:
        if path.endswith("/models"):
            models = {"object": "list", "data": [{"id": "hostile", "owned_by": "hostile"}]}
            return await _json(writer, 200, models)
        if path == "/health":
            return await _json(writer, 200, {"status": "ok"})
        if path == "/stats":
            return await _json(writer, 200, {"requests": self.requests, "left": self.left})
        prompt = str(body.get("prompt") or (body.get("messages") or [{}])[-1].get("content"))
        self.requests[prompt] += 1
        word, *args = prompt.split() or [""]
        behaviour = getattr(self, "_" + word.replace("-", "_"), None)
        if behaviour is None:
            return await self._normal(writer)
        await behaviour(writer, args, self.requests[prompt])

    async def _normal(self, writer: asyncio.StreamWriter) -> None:
        writer.write(_OK_HEAD)
        for word in ("one ", "two ", "three ", "four"):
            writer.write(_token(word))
        writer.write(_event({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()

    async def _huge_token(self, writer: asyncio.StreamWriter, args: list[str], seen: int) -> None:
        mb = args[0]
        writer.write(_OK_HEAD + b'data: {"choices":[{"index":0,"text":"')
        piece = b"a" * MB
        for _ in range(int(mb)):
            writer.write(piece)
            await writer.drain()
        writer.write(b'","finish_reason":null}]}\n\n')
        await self._normal_end(writer)

    async def _huge_error(self, writer: asyncio.StreamWriter, args: list[str], seen: int) -> None:
        mb = args[0]
        size = int(mb) * MB
        writer.write(
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % size
        )
        writer.write(b'{"error": {"message": "')
        piece = b"e" * MB
        for _ in range(int(mb) - 1):
            writer.write(piece)
            await writer.drain()
        writer.write(b"e" * (MB - 27) + b'"}}')
        await writer.drain()

    async def _trickle(self, writer: asyncio.StreamWriter, args: list[str], seen: int) -> None:
        every = args[0]
        writer.write(_OK_HEAD)
        while True:
            writer.write(b": ping\n\n")
            await writer.drain()
            await asyncio.sleep(float(every))
            if writer.is_closing():
                raise ConnectionResetError

    async def _drip(self, writer: asyncio.StreamWriter, args: list[str], seen: int) -> None:
        every = args[0]
        writer.write(_OK_HEAD)
        while True:
            writer.write(_token("drop "))
            await writer.drain()
            await asyncio.sleep(float(every))
            if writer.is_closing():
                raise ConnectionResetError

    async def _big_tokens(self, writer: asyncio.StreamWriter, args: list[str], seen: int) -> None:
        kib = args[0]
        writer.write(_OK_HEAD)
        token = _token("b" * (int(kib) << 10))
        while True:
            writer.write(token)
            await writer.drain()
            await asyncio.sleep(0)

    async def _busy(self, writer: asyncio.StreamWriter, args: list[str], seen: int) -> None:
        status, times, wait = args[:3]
        if seen > int(times):
            return await self._normal(writer)
        payload = json.dumps({"error": {"message": "the engine is busy"}}).encode()
        writer.write(
            b"HTTP/1.1 %s Busy\r\ncontent-type: application/json\r\nretry-after: %s\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status.encode(), wait.encode(), len(payload), payload)
        )
        await writer.drain()

    async def _normal_end(self, writer: asyncio.StreamWriter) -> None:
        writer.write(_event({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


def _token(text: str) -> bytes:
    return _event({"choices": [{"index": 0, "text": text, "finish_reason": None}]})


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _json(writer: asyncio.StreamWriter, status: int, value: Any) -> None:
    payload = json.dumps(value).encode()
    writer.write(
        b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, len(payload), payload)
    )
    await writer.drain()


async def _request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, Any]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    raw = await reader.readexactly(length) if length else b""
    return method, path.split("?")[0], json.loads(raw) if raw else {}


async def _serve(host: str, port: int) -> None:
    engine = Engine()
    server = await asyncio.start_server(engine.handle, host, port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
