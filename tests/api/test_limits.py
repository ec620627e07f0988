"""Each configured limit refuses with its error: size limits 413, rates and streams 429."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestrator_core.errors import LimitExceeded
from orchestrator_core.keys import Scope
from orchestratord.api.app import create_app
from orchestratord.api.body_limit import BodyLimitMiddleware
from orchestratord.auth import store
from orchestratord.auth.streams import KeyStreams
from orchestratord.db.engine import Database
from orchestratord.db.models import KeyUsage
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import StreamsWatch, make_flow, make_run, submit


def _limit_error(r: httpx.Response, status: int, limit: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert body["code"] == "LIMIT_EXCEEDED"
    assert body["details"]["limit"] == limit
    if status == 429:
        assert body["retriable"] is True
        assert body["retry_after_ms"] > 0
        assert int(r.headers["retry-after"]) >= 1
    else:
        assert body["retriable"] is False
        assert body["retry_after_ms"] is None
    return body


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(
        db_url,
        auth={"cache_s": 0},
        limits={
            "max_body_bytes": 4096,
            "max_prompt_chars": 100,
            "max_tools_per_flow": 2,
            "max_tool_schema_bytes": 200,
            "max_followers_per_key": 2,
        },
    )


async def test_body_size(client: httpx.AsyncClient) -> None:
    big = {"ast": {"pad": "x" * 5000}}
    body = _limit_error(await client.post("/v1/flows", json=big), 413, "limits.max_body_bytes")
    assert body["details"]["field"] == "body"

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"ast": {"pad": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}}'

    r = await client.post(
        "/v1/flows", content=chunked(), headers={"content-type": "application/json"}
    )
    _limit_error(r, 413, "limits.max_body_bytes")

    async def small() -> AsyncIterator[bytes]:
        yield b'{"ast": '
        yield b'{"small": true}}'

    r = await client.post(
        "/v1/flows", content=small(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 201, r.text


async def test_a_content_length_beside_chunked_transfer_is_not_taken_as_the_size() -> None:
    """Some HTTP servers (h11) read such a body as chunked and keep the header: the
    middleware counts the body then, whatever the header declares."""
    reached: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append((await receive())["body"])

    limited = BodyLimitMiddleware(app, max_bytes=100)
    chunks = [b"x" * 60, b"x" * 60]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/flows",
        "headers": [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")],
    }
    await limited(scope, receive, send)
    assert reached == []
    assert sent[0]["status"] == 413


async def test_a_key_is_asked_for_before_a_body_is_read(db_url: str) -> None:
    """Without a key, a large chunked body is answered 401, not read up to the size limit."""
    orch = Orchestrator(make_settings(db_url, limits={"max_body_bytes": 4096}))
    await orch.start()
    try:
        async with orch.db.write() as session:
            await store.create(session, scope=Scope.WRITE, name="someone")

        async def chunked() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b"x" * 1000

        app = create_app(orchestrator=orch)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            r = await c.post("/v1/flows", content=chunked())
            assert r.status_code == 401, r.text
            assert r.json()["code"] == "UNAUTHENTICATED"
            for i in range(5):  # text that is no key's shape takes no room in the key cache
                r = await c.get("/v1/pools", headers={"Authorization": f"Bearer junk-{i}"})
                assert r.status_code == 401
            assert orch.auth._cache == {}
    finally:
        await orch.stop()


async def test_prompt_length(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    body = _limit_error(
        await submit(client, run_id, prompt="x" * 101), 413, "limits.max_prompt_chars"
    )
    assert body["details"]["field"] == "input.prompt"
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "m",
            "input": {
                "messages": [
                    {"role": "system", "content": "s" * 60},
                    {"role": "user", "content": "u" * 60},
                ],
                "params": {"max_tokens": 4},
            },
        },
    )
    assert _limit_error(r, 413, "limits.max_prompt_chars")["details"]["field"] == "input.messages"
    assert (await submit(client, run_id, prompt="x" * 100)).status_code == 202
    steps = (await client.get(f"/v1/runs/{run_id}/steps")).json()
    assert len(steps) == 1  # the refused ones left nothing behind


def _tool(name: str, props: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "parameters": {
            "type": "object",
            "properties": {f"p{i}": {"type": "string"} for i in range(props)},
        },
        "executor": {"kind": "builtin", "name": "echo"},
    }


async def test_tools_per_flow_and_schema_size(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/flows", json={"ast": {}, "tools": [_tool("a"), _tool("b"), _tool("c")]}
    )
    assert _limit_error(r, 413, "limits.max_tools_per_flow")["details"]["field"] == "tools"
    r = await client.post("/v1/flows", json={"ast": {}, "tools": [_tool("a"), _tool("b", 20)]})
    body = _limit_error(r, 413, "limits.max_tool_schema_bytes")
    assert body["details"]["field"] == "tools[1].parameters"
    assert await make_flow(client, {}, tools=[_tool("a"), _tool("b")])


async def _key(orch: Orchestrator, scope: Scope = Scope.WRITE) -> str:
    async with orch.db.write() as session:
        return await store.create(session, scope=scope, name=None)


async def test_streams_per_key(
    orch: Orchestrator, live: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = StreamsWatch(orch, monkeypatch)
    key, other = await _key(orch), await _key(orch)
    live.headers["Authorization"] = f"Bearer {key}"
    run_id = await make_run(live)
    async with (
        live.stream("GET", f"/v1/runs/{run_id}/stream") as a,
        live.stream("GET", f"/v1/runs/{run_id}/stream") as b,
    ):
        assert a.status_code == b.status_code == 200
        r = await live.get(f"/v1/runs/{run_id}/stream")
        _limit_error(r, 429, "limits.max_followers_per_key")
        assert orch.key_streams.count(key[3:15]) == 2
        # another key is not held back by this one's streams
        async with live.stream(
            "GET", f"/v1/runs/{run_id}/stream", headers={"Authorization": f"Bearer {other}"}
        ) as c:
            assert c.status_code == 200
    await streams.until(lambda: orch.key_streams.count(key[3:15]) == 0)  # the server saw them go
    async with live.stream("GET", f"/v1/runs/{run_id}/stream") as again:
        assert again.status_code == 200


async def test_requests_per_minute_shared_by_processes(pg_url: str, tmp_path: Any) -> None:
    """Two processes on one PostgreSQL database share a key's per-minute budget."""
    settings = make_settings(pg_url, auth={"cache_s": 0}, limits={"requests_per_minute": 10})
    a, b = Orchestrator(settings), Orchestrator(settings)
    await a.start()
    await b.start()
    # one minute throughout, whatever the machine's speed: the test must not straddle two
    minute = 60.0 * (time.time() // 60) + 30.0
    a.rates._clock = b.rates._clock = lambda: minute
    try:
        key = await _key(a, Scope.READ)
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            serve_app(create_app(orchestrator=a)) as url_a,
            serve_app(create_app(orchestrator=b)) as url_b,
            httpx.AsyncClient(headers=headers) as c,
        ):
            for _ in range(6):
                assert (await c.get(f"{url_a}/v1/pools")).status_code == 200
            await a.rates.flush()
            await b.rates.flush()  # b learns a's 6
            for _ in range(4):
                assert (await c.get(f"{url_b}/v1/pools")).status_code == 200
            r = await c.get(f"{url_b}/v1/pools")
            body = _limit_error(r, 429, "limits.requests_per_minute")
            assert body["retry_after_ms"] <= 60_000
            await b.rates.flush()
            await a.rates.flush()  # a learns b's 4
            _limit_error(await c.get(f"{url_a}/v1/pools"), 429, "limits.requests_per_minute")
            # another key has its own minute
            other = await _key(a, Scope.READ)
            ok = await c.get(f"{url_a}/v1/pools", headers={"Authorization": f"Bearer {other}"})
            assert ok.status_code == 200
    finally:
        await a.stop()
        await b.stop()
        db = Database(pg_url)
        async with db.engine.begin() as conn:
            await conn.execute(sa.text("TRUNCATE api_keys, key_usage"))
        await db.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_tokens_per_minute(db_url: str) -> None:
    settings = make_settings(db_url, auth={"cache_s": 0}, limits={"tokens_per_minute": 30})
    orch = Orchestrator(settings)
    await orch.start()
    try:
        key = await _key(orch)
        app = create_app(orchestrator=orch)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers={"Authorization": f"Bearer {key}"},
        ) as c:
            run_id = await make_run(c)
            assert (await submit(c, run_id, token="a", max_tokens=16)).status_code == 202
            assert (await submit(c, run_id, token="b", max_tokens=16)).status_code == 202
            r = await submit(c, run_id, token="c", max_tokens=16)
            _limit_error(r, 429, "limits.tokens_per_minute")
            await orch.rates.flush()
            async with orch.db.read() as session:
                row = (await session.execute(sa.select(KeyUsage.requests, KeyUsage.tokens))).one()
            assert row.tokens >= 30 and row.requests >= 4
    finally:
        await orch.stop()


async def test_a_stream_never_started_is_not_counted_forever() -> None:
    """The client left before the first byte: the response closes a body it never read."""
    streams = KeyStreams(limit=1)

    async def body() -> AsyncIterator[bytes]:
        yield b": hello\n\n"

    streams.open("k1")
    held = streams.held("k1", body())
    with pytest.raises(LimitExceeded):
        streams.open("k1")
    await held.aclose()  # type: ignore[attr-defined]
    assert streams.count("k1") == 0
    streams.open("k1")
    assert [chunk async for chunk in streams.held("k1", body())] == [b": hello\n\n"]
    assert streams.count("k1") == 0
