"""A loopback HTTP/1.1 proxy between a browser and the server that a test can cut.

The browser is pointed at the proxy as if it were the server. ``cut()`` aborts every
connection at once, mid-response where a stream is open: a real drop, seen by the browser
as a network error. Each request's line and ``Last-Event-ID`` are logged as the browser sent
them; with ``rewind`` set, the proxy passes on a ``Last-Event-ID`` that many events earlier,
so the server sends again events the page has already shown (which it must not show twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_LAST_EVENT_ID = re.compile(rb"(?im)^last-event-id:[ \t]*(\d+)")


@dataclass
class Seen:
    line: str  # "GET /v1/runs/... HTTP/1.1"
    last_event_id: int | None  # as the browser sent it


@dataclass
class CuttingProxy:
    upstream: tuple[str, int]
    rewind: int = 0
    url: str = ""
    requests: list[Seen] = field(default_factory=list)
    cuts: int = 0
    _open: set[asyncio.StreamWriter] = field(default_factory=set)

    def resumes(self) -> list[Seen]:
        return [r for r in self.requests if r.last_event_id is not None]

    def cut(self) -> int:
        """Abort every open connection, browser's side and server's; how many were open."""
        writers = list(self._open)
        for writer in writers:
            writer.transport.abort()
        self.cuts += 1
        return len(writers) // 2

    def _rewrite(self, head: bytes) -> bytes:
        found = _LAST_EVENT_ID.search(head)
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        self.requests.append(Seen(line, int(found.group(1)) if found else None))
        if found is None or not self.rewind:
            return head
        earlier = max(0, int(found.group(1)) - self.rewind)
        return head[: found.start(1)] + str(earlier).encode() + head[found.end(1) :]

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Browser to server: request heads (rewritten) and their bodies."""
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:[ \t]*(\d+)", head)
            body = await reader.readexactly(int(length.group(1))) if length else b""
            writer.write(self._rewrite(head) + body)
            await writer.drain()

    async def _responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        pair = {writer, up_writer}
        self._open |= pair
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                done, pending = await asyncio.wait(
                    [
                        asyncio.create_task(self._requests(reader, up_writer)),
                        asyncio.create_task(self._responses(up_reader, writer)),
                    ],
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in pending:
                    task.cancel()
                for task in [*done, *pending]:
                    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                        await task
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._open -= pair
            for w in pair:
                w.close()


@contextlib.asynccontextmanager
async def cutting_proxy(upstream_url: str, *, rewind: int = 0) -> AsyncIterator[CuttingProxy]:
    """A proxy to ``upstream_url`` on a loopback port until the block ends."""
    target = urlsplit(upstream_url)
    assert target.hostname is not None and target.port is not None
    proxy = CuttingProxy((target.hostname, target.port), rewind=rewind)
    server = await asyncio.start_server(proxy._serve, "127.0.0.1", 0)
    proxy.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield proxy
    finally:
        proxy.cut()
        server.close()
        await server.wait_closed()
