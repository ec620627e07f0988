"""The engines' HTTP/1.1 client against real peers: scripted TCP servers that write exact
bytes (bodies by length, chunked, or ending at close; stalls; garbage; connections closed
at the worst moment), a TLS server, and uvicorn under uvloop."""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import uvloop

from test_harness.fake_openai import FakeState, create_fake_openai
from test_harness.servers import serve_app
from worker_adapters.http1 import (
    HIGH_WATER,
    Broken,
    ConnectFailed,
    Http1Client,
    TimedOut,
    _DirectResponse,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@asynccontextmanager
async def raw_server(
    handler: Handler, *, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server running ``handler(reader, writer, n)`` for its n-th connection (from 0);
    yields its address and the list of connection numbers it accepted."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = len(accepted)
        accepted.append(n)
        try:
            await handler(reader, writer, n)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"127.0.0.1:{port}", accepted


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request: its head, and its body by Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


def answer(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


def answer_each(seen: list[bytes], *, delay_s: float = 0.0) -> Handler:
    """A handler answering "ok" to every request of its connection (after ``delay_s``),
    keeping each request in ``seen``, until the client leaves."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            try:
                seen.append(await read_request(reader))
            except asyncio.IncompleteReadError:
                return
            await asyncio.sleep(delay_s)
            writer.write(answer(b"ok"))
            await writer.drain()

    return handler


async def test_body_by_length_and_the_request_as_sent() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        seen.append(await read_request(reader))
        writer.write(answer(b'{"ok":true}', b"x-engine: fake"))
        await writer.drain()

    async with raw_server(handler) as (addr, _):
        client = Http1Client(f"http://{addr}/v1", headers={"Authorization": "Bearer k"})
        async with client.stream("POST", "/v1/completions", body=b'{"a":1}') as response:
            assert response.status == 200
            assert response.header("X-Engine") == "fake"
            assert await response.read() == b'{"ok":true}'
        await client.aclose()
    head, _, body = seen[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/completions HTTP/1.1"
    assert f"host: {addr}".encode() in lines
    assert b"authorization: Bearer k" in lines
    assert b"content-type: application/json" in lines and b"content-length: 7" in lines
    assert body == b'{"a":1}'


async def test_credentials_and_query_of_the_base_url() -> None:
    seen: list[bytes] = []

    async with raw_server(answer_each(seen)) as (addr, _):
        client = Http1Client(f"http://al%40ice:s3cret@{addr}/v1?api-version=2&region=eu")
        assert client.prefix == "/v1"
        with pytest.raises(ConnectFailed) as refused:  # messages name no credential
            await Http1Client("http://al:s3cret@127.0.0.1:1/v1?key=k").request("GET", "/v1")
        assert "s3cret" not in str(refused.value) and "key=k" not in str(refused.value)
        await client.request("GET", "/v1/models")
        await client.request("GET", "/v1/models?page=2")
        bearer = Http1Client(f"http://al:s3cret@{addr}", headers={"Authorization": "Bearer k"})
        await bearer.request("GET", "/")
        await client.aclose()
        await bearer.aclose()
    first, second, third = (r.split(b"\r\n") for r in seen)
    assert first[0] == b"GET /v1/models?api-version=2&region=eu HTTP/1.1"
    assert second[0] == b"GET /v1/models?page=2&api-version=2&region=eu HTTP/1.1"
    basic = base64.b64encode(b"al@ice:s3cret").decode()
    assert f"authorization: Basic {basic}".encode() in first
    assert f"host: {addr}".encode() in first
    assert b"authorization: Bearer k" in third
    assert not any(line.startswith(b"authorization: Basic") for line in third)


async def test_chunked_body_arrives_as_sent_and_the_connection_is_kept() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        for _ in range(3):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in (b"data: a\n\n", b"data: b\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with raw_server(handler) as (addr, accepted):
        client = Http1Client(f"http://{addr}")
        for _ in range(3):
            async with client.stream("GET", "/s") as response:
                parts = [chunk async for chunk in response.chunks()]
            assert b"".join(parts) == b"data: a\n\ndata: b\n\n"
            assert len(parts) == 2  # each as it came, not the whole body at its end
        await client.aclose()
    assert accepted == [0]


async def test_body_ending_at_close_and_connection_close_are_not_kept() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()

    async with raw_server(handler) as (addr, accepted):
        client = Http1Client(f"http://{addr}")
        for _ in range(2):
            status, body = await client.request("GET", "/")
            assert (status, body) == (200, b"until the end")
        await client.aclose()
    assert accepted == [0, 1]


async def test_a_kept_connection_the_engine_closed_is_retried_once_on_a_new_one() -> None:
    """The engine closed the idle connection just as the next request went out on it: the
    request never reached it, so it goes again on a fresh connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 0:
            writer.write(answer(b"first"))
            await writer.drain()
            await read_request(reader)  # the second request: closed unanswered
            return
        writer.write(answer(b"again"))
        await writer.drain()

    async with raw_server(handler) as (addr, accepted):
        client = Http1Client(f"http://{addr}")
        assert await client.request("GET", "/") == (200, b"first")
        assert await client.request("GET", "/") == (200, b"again")
        await client.aclose()
    assert accepted == [0, 1]


async def test_a_new_connection_closed_unanswered_is_broken_not_retried() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async with raw_server(handler) as (addr, accepted):
        client = Http1Client(f"http://{addr}")
        with pytest.raises(Broken, match="closed the connection before the response ended"):
            await client.request("POST", "/x", body=b"{}")
        await client.aclose()
    assert accepted == [0]


async def test_a_body_cut_short_is_broken() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()

    async with raw_server(handler) as (addr, _):
        client = Http1Client(f"http://{addr}")
        async with client.stream("GET", "/") as response:
            got = b""
            with pytest.raises(Broken):
                async for chunk in response.chunks():
                    got += chunk
            assert got == b"only this"
        await client.aclose()


async def test_what_is_not_http_is_broken() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with raw_server(handler) as (addr, _):
        client = Http1Client(f"http://{addr}")
        with pytest.raises(Broken, match="not an HTTP response"):
            await client.request("GET", "/")
        await client.aclose()


async def test_no_head_and_a_stalled_body_time_out() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
        await asyncio.sleep(5)

    async with raw_server(handler) as (addr, _):
        client = Http1Client(f"http://{addr}", read_timeout_s=0.2)
        with pytest.raises(TimedOut, match=r"no answer in 0\.2 s"):
            await client.request("GET", "/")
        async with client.stream("GET", "/") as response:
            chunks = response.chunks()
            assert await chunks.__anext__() == b"abc"
            with pytest.raises(TimedOut, match=r"no bytes in 0\.2 s"):
                await chunks.__anext__()
        await client.aclose()


async def test_refused_connection_names_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Http1Client(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ConnectFailed, match=f"127.0.0.1:{port}/v1/models"):
        await client.request("GET", "/v1/models")
    await client.aclose()


async def test_closing_a_response_from_another_task_ends_its_reader_and_the_connection() -> None:
    left = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await reader.read()  # until the client closes
        left.set()

    async with raw_server(handler) as (addr, _):
        client = Http1Client(f"http://{addr}")
        async with client.stream("GET", "/") as response:
            chunks = response.chunks()
            assert await chunks.__anext__() == b"a"
            reading = asyncio.ensure_future(chunks.__anext__())
            await asyncio.sleep(0.05)
            response.close()
            with pytest.raises(Broken, match="the response was closed"):
                await reading
        await asyncio.wait_for(left.wait(), 5)
        await client.aclose()


async def test_reading_pauses_while_unread_bytes_pile_up() -> None:
    size = 4 * HIGH_WATER

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // 4096):
            writer.write(b"x" * 4096)
            await writer.drain()

    async with raw_server(handler) as (addr, _):
        client = Http1Client(f"http://{addr}")
        async with client.stream("GET", "/") as response:
            await asyncio.sleep(0.3)  # the server writes as fast as it can; nobody reads
            assert isinstance(response, _DirectResponse)  # no proxy: this module's own reading
            conn = response._conn
            assert conn.paused and conn.buffered < 2 * HIGH_WATER
            body = await response.read()
        assert body == b"x" * size
        await client.aclose()


async def test_requests_past_the_pool_wait_for_a_connection() -> None:
    async with raw_server(answer_each([], delay_s=0.05)) as (addr, accepted):
        client = Http1Client(f"http://{addr}", connections=1)
        got = await asyncio.gather(*(client.request("GET", "/") for _ in range(4)))
        assert got == [(200, b"ok")] * 4
        await client.aclose()
    assert accepted == [0]


async def test_https_with_the_given_authority(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(answer(b"secret"))
        await writer.drain()

    async with raw_server(handler, ssl_context=server_ctx) as (addr, _):
        port = addr.rsplit(":", 1)[1]
        trusting = ssl.create_default_context(cafile=str(cert))
        client = Http1Client(f"https://localhost:{port}", ssl_context=trusting)
        assert await client.request("GET", "/") == (200, b"secret")
        await client.aclose()
        stranger = Http1Client(f"https://localhost:{port}")  # the system's CAs: refused
        with pytest.raises(ConnectFailed):
            await stranger.request("GET", "/")
        await stranger.aclose()


def test_bad_base_url_and_header_are_refused() -> None:
    with pytest.raises(ValueError, match="base_url"):
        Http1Client("ftp://engine")
    with pytest.raises(ValueError, match="line breaks"):
        Http1Client("http://engine", headers={"authorization": "Bearer k\r\nx: y"})


def test_under_uvloop_against_uvicorn() -> None:
    """The server runs on uvloop, whose transports are not asyncio's classes."""

    async def main() -> list[tuple[int, bytes]]:
        state = FakeState()
        async with serve_app(create_fake_openai(state)) as url:
            client = Http1Client(f"{url}/v1")
            got = [await client.request("GET", "/v1/models") for _ in range(3)]
            await client.aclose()
        assert len(set(state.client_ports)) <= 1
        return got

    got = uvloop.run(main())
    assert [status for status, _ in got] == [200, 200, 200]
    assert b"fake-model" in got[0][1]


def test_an_answer_sent_before_the_request_is_read_is_the_response() -> None:
    """An engine that answers at once (503 and close, at accept; a server in its own thread):
    under uvloop the bytes can arrive before the request is written. They are the response,
    not lost, and the closed connection is not written to."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()

    async def main() -> list[int]:
        client = Http1Client(f"http://127.0.0.1:{port}", read_timeout_s=2)
        got = []
        for _ in range(20):
            got.append((await client.request("GET", "/"))[0])
            await asyncio.sleep(0.01)
        await client.aclose()
        return got

    try:
        assert uvloop.run(main()) == [503] * 20
    finally:
        listener.close()


async def test_interim_responses_are_skipped_and_trailers_are_not_headers() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        writer.write(b"0\r\nx-trailer: t\r\n\r\n")
        await writer.drain()
        await read_request(reader)
        writer.write(answer(b"second"))
        await writer.drain()

    async with raw_server(handler) as (addr, accepted):
        client = Http1Client(f"http://{addr}")
        async with client.stream("GET", "/a") as response:
            assert response.status == 200
            assert await response.read() == b"first"
            assert response.header("link") is None and response.header("x-trailer") is None
        assert await client.request("GET", "/b") == (200, b"second")
        await client.aclose()
    assert accepted == [0]


async def test_a_body_ending_at_close_cut_by_this_client_is_broken_not_complete() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npart")
        await writer.drain()
        await asyncio.sleep(5)

    async with raw_server(handler) as (addr, _):
        client = Http1Client(f"http://{addr}")
        async with client.stream("GET", "/") as response:
            chunks = response.chunks()
            assert await chunks.__anext__() == b"part"
            await client.aclose()
            with pytest.raises(Broken, match="closed by this client"):
                await chunks.__anext__()


async def test_head_is_refused() -> None:
    client = Http1Client("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="HEAD"):
        await client.request("HEAD", "/")
