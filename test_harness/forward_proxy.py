"""A forward HTTP proxy on loopback, for tests of clients that honour ``HTTP_PROXY``.

Plain HTTP: requests come with an absolute target (``GET http://host:port/path HTTP/1.1``)
and go to that host with the path alone; a client's connection stays open for its next
request (one upstream connection per client connection, replaced when the target's host
changes), and the upstream's bytes are relayed as they come, so a body ending at close ends
at close here too. ``CONNECT host:port`` opens a tunnel (for ``https`` engines). Every
request line and ``Proxy-Authorization`` is recorded; an upstream that refuses is a 502.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n"


@dataclass
class ProxyLog:
    requests: list[str] = field(default_factory=list)  # "METHOD target" as received
    credentials: list[str | None] = field(default_factory=list)  # Proxy-Authorization
    connections: int = 0  # client connections accepted


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes from ``reader`` to ``writer`` until its end, then ``writer`` closed."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


def _header(head: bytes, name: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


class _Client:
    """One client connection and its upstream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.authority: str | None = None
        self.upstream: asyncio.StreamWriter | None = None
        self.relay: asyncio.Task[None] | None = None

    async def serve(self, log: ProxyLog) -> None:
        while True:
            try:
                head = await self.reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            line, _, rest = head.partition(b"\r\n")
            method, target, version = line.decode("latin-1").split(" ", 2)
            log.requests.append(f"{method} {target}")
            log.credentials.append(_header(head, b"proxy-authorization"))
            if method == "CONNECT":
                await self.tunnel(target)
                return
            length = int(_header(head, b"content-length") or 0)
            body = await self.reader.readexactly(length) if length else b""
            url = urlsplit(target)
            if url.scheme != "http" or not url.netloc:
                self.writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                return
            if url.netloc != self.authority and not await self.connect(url.netloc):
                self.writer.write(BAD_GATEWAY)
                continue
            assert self.upstream is not None
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            self.upstream.write(f"{method} {path} {version}\r\n".encode("latin-1") + rest + body)

    async def connect(self, authority: str) -> bool:
        await self.drop_upstream()
        host, _, port = authority.rpartition(":")
        try:
            upstream_reader, self.upstream = await asyncio.open_connection(host, int(port))
        except OSError:
            return False
        self.authority = authority
        self.relay = asyncio.create_task(_relay(upstream_reader, self.writer))
        return True

    async def tunnel(self, authority: str) -> None:
        host, _, port = authority.rpartition(":")
        try:
            upstream_reader, upstream = await asyncio.open_connection(host, int(port))
        except OSError:
            self.writer.write(BAD_GATEWAY)
            return
        self.writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_relay(self.reader, upstream), _relay(upstream_reader, self.writer))

    async def drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        if self.relay is not None:
            self.relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.relay
        self.upstream = self.relay = self.authority = None


@contextlib.asynccontextmanager
async def forward_proxy() -> AsyncIterator[tuple[str, ProxyLog]]:
    """A proxy on a loopback port until the block ends; yields its URL and its log."""
    log = ProxyLog()
    tasks: set[asyncio.Task[None]] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        log.connections += 1
        client = _Client(reader, writer)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await client.serve(log)
        finally:
            tasks.discard(task)
            if client.upstream is not None:
                client.upstream.close()  # the client left: so does the proxy, upstream
            if client.relay is not None:
                await asyncio.wait([client.relay])
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
