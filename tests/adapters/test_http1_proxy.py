"""The engines' HTTP/1.1 client behind a forward proxy: the standard variables
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``, in either case) send an
engine's requests through a real proxy on loopback, with the same results as without one."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import AsyncGenerator

import pytest
import uvloop

from test_harness.fake_openai import FakeState, Faults, create_fake_openai, fake_tokens
from test_harness.forward_proxy import forward_proxy
from test_harness.servers import serve_app
from tests.adapters.test_http1 import answer_each, raw_server, read_request
from tests.adapters.test_http1_vs_httpx import Tls, tls  # noqa: F401 (a fixture)
from worker_adapters import EngineFailure, Finish, GenerationRequest, Token
from worker_adapters.http1 import Broken, ConnectFailed, Http1Client, TimedOut, proxy_for
from worker_adapters.openai import OpenAIAdapter

VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it means; none comes from the machine."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.mark.parametrize(
    ("variables", "url", "proxy"),
    [
        ({}, "http://engine:8000/v1", None),
        ({"HTTP_PROXY": "http://p:3128"}, "http://engine:8000/v1", "http://p:3128"),
        ({"http_proxy": "http://p:3128"}, "http://engine:8000/v1", "http://p:3128"),
        ({"HTTP_PROXY": "http://p:3128"}, "https://engine/v1", None),
        ({"HTTPS_PROXY": "http://p:3128"}, "https://engine/v1", "http://p:3128"),
        ({"HTTPS_PROXY": "http://p:3128"}, "http://engine/v1", None),
        ({"ALL_PROXY": "http://p:3128"}, "https://engine/v1", "http://p:3128"),
        ({"HTTP_PROXY": "p:3128"}, "http://engine/v1", "http://p:3128"),
        ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "engine"}, "http://engine/v1", None),
        ({"HTTP_PROXY": "http://p:3128", "no_proxy": "other,engine"}, "http://engine/v1", None),
        ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "*"}, "http://engine/v1", None),
        ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": ".corp"}, "http://gpu1.corp/v1", None),
        ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "corp"}, "http://gpu1.corp/v1", None),
        (
            {"HTTP_PROXY": "http://p:3128", "NO_PROXY": "corp"},
            "http://gpu1.corp.example/",
            "http://p:3128",
        ),
        (
            {"HTTP_PROXY": "http://p:3128", "NO_PROXY": "engine:9000"},
            "http://engine:8000/",
            "http://p:3128",
        ),
        ({"HTTP_PROXY": "http://p:3128", "NO_PROXY": "engine"}, "http://u:pw@engine:8000/", None),
    ],
)
def test_which_urls_go_through_a_proxy(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], url: str, proxy: str | None
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert proxy_for(url) == proxy


async def test_requests_go_through_the_proxy_with_the_results_of_a_direct_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bytes] = []
    async with raw_server(answer_each(seen)) as (addr, accepted), forward_proxy() as (proxy, log):
        direct = Http1Client(f"http://{addr}/v1?region=eu", headers={"Authorization": "Bearer k"})
        monkeypatch.setenv("HTTP_PROXY", proxy)
        proxied = Http1Client(f"http://{addr}/v1?region=eu", headers={"Authorization": "Bearer k"})
        for client in (direct, proxied):
            async with client.stream("POST", "/v1/completions", body=b'{"a":1}') as response:
                assert (response.status, response.header("content-length")) == (200, "2")
                assert await response.read() == b"ok"
            assert await client.request("GET", "/v1/models") == (200, b"ok")
            await client.aclose()
    assert log.requests == [
        f"POST http://{addr}/v1/completions?region=eu",
        f"GET http://{addr}/v1/models?region=eu",
    ]
    assert log.connections == 1 and accepted == [0, 1]  # kept alive through the proxy
    for via_direct, via_proxy in ((seen[0], seen[2]), (seen[1], seen[3])):
        ours, theirs = (set(r.lower().split(b"\r\n")) for r in (via_direct, via_proxy))
        assert ours == theirs - {b"connection: keep-alive"}  # what the engine receives


@pytest.mark.parametrize("spelling", [str.upper, str.lower])
async def test_no_proxy_sends_its_hosts_direct(
    monkeypatch: pytest.MonkeyPatch, spelling: type[str]
) -> None:
    async with raw_server(answer_each([])) as (addr, _), forward_proxy() as (proxy, log):
        monkeypatch.setenv(spelling("HTTP_PROXY"), proxy)
        monkeypatch.setenv(spelling("NO_PROXY"), "localhost,127.0.0.1")
        client = Http1Client(f"http://{addr}")
        assert await client.request("GET", "/") == (200, b"ok")
        await client.aclose()
    assert log.requests == [] and log.connections == 0


async def test_an_https_engine_through_a_connect_tunnel(
    monkeypatch: pytest.MonkeyPatch,
    tls: Tls,  # noqa: F811
) -> None:
    async with raw_server(answer_each([]), ssl_context=tls.server()) as (addr, _):
        port = addr.rsplit(":", 1)[1]
        async with forward_proxy() as (proxy, log):
            monkeypatch.setenv("HTTPS_PROXY", proxy)
            client = Http1Client(f"https://localhost:{port}", ssl_context=tls.client())
            assert await client.request("GET", "/a") == (200, b"ok")
            assert await client.request("GET", "/b") == (200, b"ok")
            await client.aclose()
            stranger = Http1Client(f"https://localhost:{port}")  # the system's CAs: refused
            with pytest.raises(ConnectFailed, match="through the proxy"):
                await stranger.request("GET", "/")
            await stranger.aclose()
    assert log.requests == [f"CONNECT localhost:{port}"] * 2


async def test_proxy_credentials_are_sent_to_it_and_named_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with raw_server(answer_each([])) as (addr, _), forward_proxy() as (proxy, log):
        monkeypatch.setenv("HTTP_PROXY", proxy.replace("http://", "http://al:s3cret@"))
        client = Http1Client(f"http://{addr}")
        assert await client.request("GET", "/") == (200, b"ok")
        await client.aclose()
    assert log.credentials == ["Basic " + base64.b64encode(b"al:s3cret").decode()]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://al:s3cret@127.0.0.1:{port}")  # no proxy there
    client = Http1Client("http://engine.internal:8000/v1")
    with pytest.raises(ConnectFailed) as refused:
        await client.request("GET", "/v1/models")
    assert "engine.internal:8000/v1/models" in str(refused.value)
    assert "s3cret" not in str(refused.value) and str(port) not in str(refused.value)
    await client.aclose()


async def test_errors_through_the_proxy_are_this_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 0:  # a body cut short
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
            return
        if n == 1:  # a body that stalls
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await reader.read()  # until the client leaves

    async with raw_server(handler) as (addr, _), forward_proxy() as (proxy, _log):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        client = Http1Client(f"http://{addr}", read_timeout_s=10)
        async with client.stream("GET", "/") as response:
            got = b""
            with pytest.raises(Broken, match=f"http://{addr}/"):
                async for chunk in response.chunks():
                    got += chunk
            assert got == b"only this"
        async with client.stream("GET", "/", timeout_s=1) as response:  # this request's own
            chunks = response.chunks()
            assert await chunks.__anext__() == b"abc"
            with pytest.raises(TimedOut, match=r"no bytes in 1 s"):
                await chunks.__anext__()
        with pytest.raises(TimedOut, match=r"no answer in 1 s"):
            await client.request("GET", "/", timeout_s=1)
        with pytest.raises(ValueError, match="HEAD"):
            await client.request("HEAD", "/")
        await client.aclose()
        with pytest.raises(ConnectFailed, match="the client is closed"):
            await client.request("GET", "/")


async def test_closing_a_response_ends_its_reader_and_the_connection_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From another task while a read waits, and with no read waiting (the adapter's cancel
    between two tokens): the engine sees the client leave before the block ends."""
    left = [asyncio.Event(), asyncio.Event()]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await reader.read()  # until the proxy leaves, when the client has
        left[n].set()

    async with raw_server(handler) as (addr, _), forward_proxy() as (proxy, _log):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        client = Http1Client(f"http://{addr}")
        async with client.stream("GET", "/") as response:
            chunks = response.chunks()
            assert await chunks.__anext__() == b"a"
            reading = asyncio.ensure_future(chunks.__anext__())
            while getattr(response, "_reader", None) is None:  # until the read waits
                await asyncio.sleep(0)
            response.close()
            with pytest.raises(Broken, match="the response was closed"):
                await reading
            await left[0].wait()
        async with client.stream("GET", "/") as response:
            chunks = response.chunks()
            assert await chunks.__anext__() == b"a"
            response.close()
            await left[1].wait()
            with pytest.raises(Broken, match="the response was closed"):
                await chunks.__anext__()
        await client.aclose()


def generation(request_id: str = "r1", max_tokens: int = 12) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id, prompt="hello", messages=None, seed=7, max_tokens=max_tokens
    )


async def test_the_openai_adapter_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    state = FakeState()
    async with serve_app(create_fake_openai(state)) as url, forward_proxy() as (proxy, log):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        adapter = OpenAIAdapter(base_url=f"{url}/v1", model="fake-model", api_key="sk-secret")
        events = [event async for event in adapter.stream(generation())]
        assert [e.text for e in events if isinstance(e, Token)] == fake_tokens(state.requests[0])
        assert isinstance(events[-1], Finish) and events[-1].tokens_out == 12
        assert state.auth_headers == ["Bearer sk-secret"]
        assert (await adapter.health()).ready
        assert (await adapter.capabilities()).model == "fake-model"
        await adapter.aclose()
    assert log.requests == [
        f"POST {url}/v1/completions",
        f"GET {url}/health",
        f"GET {url}/v1/models",
    ]
    assert log.connections == 1


async def test_the_openai_adapters_cancel_through_a_proxy_closes_upstream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    left = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        part = b'data: {"choices":[{"text":"a"}]}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        await writer.drain()
        await reader.read()  # until the client leaves
        left.set()

    async with raw_server(handler) as (addr, _), forward_proxy() as (proxy, _log):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        adapter = OpenAIAdapter(base_url=f"http://{addr}/v1", model="m")
        gen = adapter.stream(generation())
        assert isinstance(gen, AsyncGenerator)
        first = await gen.__anext__()
        assert isinstance(first, Token) and first.text == "a"
        await adapter.cancel("r1")
        await left.wait()  # the cancel alone closed it, as on the direct path
        with pytest.raises(EngineFailure, match="the response was closed"):
            await gen.__anext__()
        await gen.aclose()
        await adapter.aclose()


async def test_a_client_made_before_the_variables_is_not_changed_by_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with raw_server(answer_each([])) as (addr, _), forward_proxy() as (proxy, log):
        client = Http1Client(f"http://{addr}")
        monkeypatch.setenv("HTTP_PROXY", proxy)
        assert await client.request("GET", "/") == (200, b"ok")
        await client.aclose()
    assert log.requests == []


def test_through_a_proxy_under_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server runs on uvloop: httpx's reading there, and a close that cancels a read."""

    async def main() -> None:
        state = FakeState()
        async with serve_app(create_fake_openai(state)) as url, forward_proxy() as (proxy, log):
            monkeypatch.setenv("HTTP_PROXY", proxy)
            client = Http1Client(f"{url}/v1")
            status, body = await client.request("GET", "/v1/models")
            assert status == 200 and b"fake-model" in body
            state.faults = Faults(token_delay_s=1.0)  # a read that waits
            async with client.stream("POST", "/v1/completions", body=b"{}") as response:
                reading = asyncio.ensure_future(response.read())
                while getattr(response, "_reader", None) is None:  # until the read waits
                    assert not reading.done()
                    await asyncio.sleep(0)
                response.close()
                with pytest.raises(Broken, match="the response was closed"):
                    await reading
            await client.aclose()
        assert log.requests == [f"GET {url}/v1/models", f"POST {url}/v1/completions"]

    uvloop.run(main())
