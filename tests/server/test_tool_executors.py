"""Tool executors against a real tool server on loopback: the failures each one reports,
retries, deadlines, reply caps and connection reuse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestratord.tools.errors import ToolFailure
from orchestratord.tools.executors import HttpToolSettings, ToolExecutors, ToolInvocation
from test_harness.fake_tools import FakeToolServer, refused_url
from test_harness.servers import serve_app


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeToolServer, str]]:
    fake = FakeToolServer()
    async with serve_app(fake.app) as url:
        yield fake, url


@pytest.fixture
async def executors() -> AsyncIterator[ToolExecutors]:
    ex = ToolExecutors(HttpToolSettings(backoff_s=0.01, max_reply_bytes=10_000))
    try:
        yield ex
    finally:
        await ex.aclose()


def http(url: str, deadline_s: float | None = None, **spec: Any) -> ToolInvocation:
    return ToolInvocation(
        tool="t",
        args={"a": 1, "b": 2},
        executor={"kind": "http", "url": url, **spec},
        deadline_s=deadline_s,
        request_id="step_1",
    )


async def failure(executors: ToolExecutors, inv: ToolInvocation) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        await executors.call(inv)
    return info.value


async def test_a_good_call(executors: ToolExecutors, server: tuple[FakeToolServer, str]) -> None:
    fake, url = server
    assert await executors.call(http(f"{url}/add")) == {"sum": 3}
    assert fake.last_idempotency_key == "step_1"


@pytest.mark.parametrize(
    ("path", "spec", "reason", "status"),
    [
        ("/status/500", {}, "status", 500),
        ("/status/404", {}, "status", 404),
        ("/slow?ms=1000", {"timeout_ms": 30}, "timeout", None),
        ("/big?bytes=20000", {}, "too_large", None),
        ("/big?bytes=20000&chunked=1", {}, "too_large", None),
        ("/big?bytes=500", {"max_reply_bytes": 100}, "too_large", None),
        ("/invalid-json", {}, "invalid_json", None),
    ],
)
async def test_failures_say_why(
    executors: ToolExecutors,
    server: tuple[FakeToolServer, str],
    path: str,
    spec: dict[str, Any],
    reason: str,
    status: int | None,
) -> None:
    _, url = server
    got = await failure(executors, http(f"{url}{path}", **spec))
    assert got.reason == reason
    assert got.status == status
    assert got.attempts == 1


async def test_a_refused_connection(executors: ToolExecutors) -> None:
    got = await failure(executors, http(refused_url()))
    assert got.reason == "connect" and got.retriable


async def test_the_deadline_wins_over_a_longer_timeout(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    _, url = server
    got = await failure(executors, http(f"{url}/slow?ms=2000", deadline_s=0.05, timeout_ms=5000))
    assert got.reason == "timeout"


@pytest.mark.parametrize(
    ("spec", "calls", "ok"),
    [
        ({"idempotent": True, "max_retries": 3}, 3, True),
        ({"idempotent": True, "max_retries": 1}, 2, False),
        ({"max_retries": 3}, 1, False),
        ({"idempotent": False, "max_retries": 3}, 1, False),
    ],
)
async def test_retries_only_for_idempotent_tools(
    executors: ToolExecutors,
    server: tuple[FakeToolServer, str],
    spec: dict[str, Any],
    calls: int,
    ok: bool,
) -> None:
    fake, url = server
    retries: list[tuple[int, str]] = []
    inv = http(f"{url}/flaky?fail=2&key={calls}{ok}", **spec)
    if ok:
        assert (await executors.call(inv, on_retry=lambda n, why: retries.append((n, why))))["ok"]
    else:
        with pytest.raises(ToolFailure) as info:
            await executors.call(inv, on_retry=lambda n, why: retries.append((n, why)))
        assert info.value.attempts == calls
    assert fake.calls["/flaky"] == calls
    assert [n for n, _ in retries] == list(range(1, calls))


async def test_a_client_error_is_never_retried(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    fake, url = server
    got = await failure(executors, http(f"{url}/status/400", idempotent=True, max_retries=3))
    assert got.reason == "status" and got.attempts == 1
    assert fake.calls["/status/400"] == 1


async def test_retries_stop_at_the_deadline(server: tuple[FakeToolServer, str]) -> None:
    fake, url = server
    slow_backoff = ToolExecutors(HttpToolSettings(backoff_s=5.0))
    try:
        inv = http(f"{url}/status/503", deadline_s=0.5, idempotent=True, max_retries=5)
        got = await failure(slow_backoff, inv)
    finally:
        await slow_backoff.aclose()
    assert got.attempts == 1  # a 5 s backoff would pass the deadline: no retry
    assert fake.calls["/status/503"] == 1


async def test_connections_are_reused(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    _, url = server
    client = executors._by_kind["http"].inner.client  # type: ignore[attr-defined]
    for _ in range(5):
        await executors.call(http(f"{url}/echo"))
    assert executors._by_kind["http"].inner.client is client  # type: ignore[attr-defined]
    pool = client._transport._pool
    assert len(pool.connections) == 1  # five calls, one connection


async def test_builtins(executors: ToolExecutors) -> None:
    def builtin(name: str, args: dict[str, Any], deadline_s: float | None = None) -> ToolInvocation:
        return ToolInvocation("t", args, {"kind": "builtin", "name": name}, deadline_s, "s")

    assert await executors.call(builtin("echo", {"x": [1]})) == {"x": [1]}
    assert await executors.call(builtin("sleep", {"ms": 1})) == {"slept_ms": 1}
    assert (await failure(executors, builtin("sleep", {"ms": 5000}, 0.01))).reason == "timeout"
    assert (await failure(executors, builtin("sleep", {"ms": "x"}))).reason == "builtin"
    assert (await failure(executors, builtin("nope", {}))).reason == "builtin"


async def test_targets() -> None:
    ex = ToolExecutors()
    assert ex.target_of(http("http://h.example:8001/a/b?q=1")) == "http:http://h.example:8001/a/b"
    assert ex.target_of(http("https://h.example/x")) == "http:https://h.example:443/x"
    inv = ToolInvocation("t", {}, {"kind": "builtin", "name": "echo"}, None, "s")
    assert ex.target_of(inv) == "builtin:echo"
    await ex.aclose()
