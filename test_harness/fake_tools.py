"""A real HTTP tool server for tests, with fault injection and call counting.

Routes (all POST): ``/echo`` (the JSON body back), ``/add`` (``{a, b}`` -> ``{sum}``),
``/slow?ms=N``, ``/status/{code}?bytes=N`` (an error reply, padded), ``/big?bytes=N`` (a JSON
string that long; ``&chunked=1`` streams it without a Content-Length), ``/invalid-json``,
``/flaky?fail=N&bucket=B`` (the first N calls per bucket answer 503). ``down()`` makes every route
answer 503 until ``up()``: a dead endpoint for breakers. ``/slow`` stops waiting when its
client goes away (counted in ``abandoned``), so a server left with a timed-out call shuts
down at once.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def refused_url() -> str:
    """A loopback URL where nothing listens (the port was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/tool"


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


class FakeToolServer:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.flaky: Counter[str] = Counter()
        self.last_idempotency_key: str | None = None
        self.client_ports: set[int] = set()  # one per TCP connection a client opened
        self.abandoned = 0  # /slow calls whose client left before the reply
        self.is_down = False
        self.app = Starlette(
            routes=[
                Route("/echo", self._echo, methods=["POST"]),
                Route("/add", self._add, methods=["POST"]),
                Route("/slow", self._slow, methods=["POST"]),
                Route("/status/{code:int}", self._status, methods=["POST"]),
                Route("/big", self._big, methods=["POST"]),
                Route("/invalid-json", self._invalid, methods=["POST"]),
                Route("/flaky", self._flaky, methods=["POST"]),
            ]
        )
        self.app.add_middleware(_Count, server=self)

    def down(self) -> None:
        self.is_down = True

    def up(self) -> None:
        self.is_down = False

    async def _echo(self, request: Request) -> Response:
        return _json(orjson.loads(await request.body()))

    async def _add(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        return _json({"sum": body["a"] + body["b"]})

    async def _slow(self, request: Request) -> Response:
        await request.body()  # after the body, the only message left to receive is a disconnect
        try:
            async with asyncio.timeout(int(request.query_params.get("ms", "1000")) / 1000):
                while (await request.receive())["type"] != "http.disconnect":
                    pass
        except TimeoutError:
            return _json({"slow": True})
        self.abandoned += 1
        return Response(status_code=499)  # nobody reads it

    async def _status(self, request: Request) -> Response:
        code = int(request.path_params["code"])
        padding = "x" * int(request.query_params.get("bytes", "0"))
        return _json({"error": f"status {code}", "padding": padding}, status=code)

    async def _big(self, request: Request) -> Response:
        size = int(request.query_params.get("bytes", "1000"))
        if request.query_params.get("chunked"):

            async def parts() -> AsyncIterator[bytes]:
                yield b'"'
                for start in range(0, size, 1000):
                    yield b"x" * min(1000, size - start)
                yield b'"'

            return StreamingResponse(parts(), media_type="application/json")
        return _json("x" * size)

    async def _invalid(self, request: Request) -> Response:
        return Response(b"{not json", media_type="application/json")

    async def _flaky(self, request: Request) -> Response:
        key = request.query_params.get("bucket", "")
        self.flaky[key] += 1
        if self.flaky[key] <= int(request.query_params.get("fail", "1")):
            return _json({"error": "try again"}, status=503)
        return _json({"ok": True, "calls": self.flaky[key]})


class _Count:
    """Counts every call by path and answers 503 while the server is down."""

    def __init__(self, app: Any, server: FakeToolServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            server = self.server
            server.calls[scope["path"]] += 1
            if scope.get("client"):
                server.client_ports.add(scope["client"][1])
            for name, value in scope.get("headers", []):
                if name == b"idempotency-key":
                    server.last_idempotency_key = value.decode()
            if server.is_down:
                await _json({"error": "down"}, status=503)(scope, receive, send)
                return
        await self.app(scope, receive, send)
