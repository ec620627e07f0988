"""Run an ASGI app on a loopback port inside the current event loop (tests and benches)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn


class InLoopServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the host program owns the signals
        yield


@contextlib.asynccontextmanager
async def serve_app(app: Any, *, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit it. Without it a response written in two parts (headers, body)
    # waits for the client's delayed ACK: ~40 ms per request with client and server in one loop.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = InLoopServer(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
