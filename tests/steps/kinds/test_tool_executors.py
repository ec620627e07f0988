"""Tool executors against a real tool server on loopback: the failures each one reports,
retries, deadlines, reply caps and connection reuse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator_core.outbound import AllowList
from orchestratord.tools.builtin import builtin_names
from orchestratord.tools.errors import ToolFailure
from orchestratord.tools.executors import HttpToolSettings, ToolExecutors, ToolInvocation
from test_harness.fake_tools import FakeToolServer, refused_url
from test_harness.servers import serve_app
from tests.conftest import LOOPBACK

LOCAL = AllowList.parse(LOOPBACK)  # the fake tool servers listen there


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeToolServer, str]]:
    fake = FakeToolServer()
    async with serve_app(fake.app) as url:
        yield fake, url


@pytest.fixture
async def executors() -> AsyncIterator[ToolExecutors]:
    ex = ToolExecutors(HttpToolSettings(backoff_s=0.01, max_reply_bytes=10_000, allow=LOCAL))
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
        ("/status/502?bytes=50000", {}, "status", 502),  # an error reply is quoted, not capped
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


async def test_a_failure_has_an_error_body(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    _, url = server
    got = await failure(executors, http(f"{url}/status/503"))
    assert got.details() == {"reason": "status", "attempts": 1, "status": 503}
    assert got.retriable
    assert "HTTP 503" in got.message and "status 503" in got.message
    assert got.__cause__ is None  # a status is no httpx error
    timeout = await failure(executors, http(f"{url}/slow?ms=1000", timeout_ms=20))
    assert timeout.details() == {"reason": "timeout", "attempts": 1}
    assert timeout.__cause__ is not None  # the httpx error stays attached, never raised


async def test_a_refused_connection(executors: ToolExecutors) -> None:
    got = await failure(executors, http(refused_url()))
    assert got.reason == "connect" and got.retriable


async def test_a_malformed_url_is_a_failure_not_a_crash(executors: ToolExecutors) -> None:
    got = await failure(executors, http("http://[::1/x", idempotent=True))
    assert got.reason == "connect" and not got.retriable and got.attempts == 1
    assert executors.target_of(http("http://[::1/x?q=1")) == "http:http://[::1/x"


async def test_the_deadline_wins_over_a_longer_timeout(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    _, url = server
    got = await failure(executors, http(f"{url}/slow?ms=2000", deadline_s=0.05, timeout_ms=5000))
    assert got.reason == "timeout"


async def test_a_spent_deadline_makes_no_call(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    fake, url = server
    got = await failure(executors, http(f"{url}/echo", deadline_s=0.0, idempotent=True))
    assert got.reason == "timeout" and got.attempts == 0
    assert fake.calls["/echo"] == 0


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
    inv = http(f"{url}/flaky?fail=2&bucket={calls}{ok}", **spec)
    if ok:
        assert (await executors.call(inv, on_retry=lambda n, why: retries.append((n, why))))["ok"]
    else:
        with pytest.raises(ToolFailure) as info:
            await executors.call(inv, on_retry=lambda n, why: retries.append((n, why)))
        assert info.value.attempts == calls
    assert fake.calls["/flaky"] == calls
    assert [n for n, _ in retries] == list(range(1, calls))


async def test_each_retry_is_told_why_and_keeps_the_key(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    fake, url = server
    told: list[tuple[int, str]] = []
    inv = http(f"{url}/flaky?fail=1&bucket=told", idempotent=True)
    assert (await executors.call(inv, on_retry=lambda n, why: told.append((n, why))))["ok"]
    assert len(told) == 1 and told[0][0] == 1 and "HTTP 503" in told[0][1]
    assert fake.last_idempotency_key == "step_1"


@pytest.mark.parametrize(
    ("path", "spec", "reason"),
    [
        ("/status/429", {}, "status"),
        ("/status/502", {}, "status"),
        ("/slow?ms=1000", {"timeout_ms": 20}, "timeout"),
    ],
)
async def test_retriable_failures_of_idempotent_tools_are_retried(
    executors: ToolExecutors,
    server: tuple[FakeToolServer, str],
    path: str,
    spec: dict[str, Any],
    reason: str,
) -> None:
    fake, url = server
    got = await failure(executors, http(f"{url}{path}", idempotent=True, max_retries=2, **spec))
    assert got.reason == reason and got.attempts == 3
    seen = fake.calls[path.split("?")[0]]
    # A short timeout can pass before a loaded server sees the request: at most, not exactly.
    assert seen == 3 if reason == "status" else seen <= 3


@pytest.mark.parametrize(
    "path", ["/status/400", "/status/404", "/invalid-json", "/big?bytes=20000"]
)
async def test_failures_a_retry_cannot_fix_are_never_retried(
    executors: ToolExecutors, server: tuple[FakeToolServer, str], path: str
) -> None:
    fake, url = server
    got = await failure(executors, http(f"{url}{path}", idempotent=True, max_retries=3))
    assert got.attempts == 1 and not got.retriable
    assert fake.calls[path.split("?")[0]] == 1


async def test_retries_stop_at_the_deadline(server: tuple[FakeToolServer, str]) -> None:
    fake, url = server
    slow_backoff = ToolExecutors(HttpToolSettings(backoff_s=5.0, allow=LOCAL))
    try:
        inv = http(f"{url}/status/503", deadline_s=0.5, idempotent=True, max_retries=5)
        got = await failure(slow_backoff, inv)
    finally:
        await slow_backoff.aclose()
    assert got.attempts == 1  # a 5 s backoff would pass the deadline: no retry
    assert got.reason == "status"  # the real failure, not the deadline, is what is reported
    assert fake.calls["/status/503"] == 1


async def test_timed_out_attempts_spend_the_deadline(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    fake, url = server
    inv = http(
        f"{url}/slow?ms=1000", deadline_s=0.1, timeout_ms=20, idempotent=True, max_retries=10
    )
    got = await failure(executors, inv)
    assert got.reason == "timeout"
    # Eleven attempts of 20 ms each cannot fit in 100 ms: the deadline ended the retries.
    assert 1 <= got.attempts < 11
    assert fake.calls["/slow"] <= got.attempts


async def test_connections_are_reused(
    executors: ToolExecutors, server: tuple[FakeToolServer, str]
) -> None:
    fake, url = server
    for _ in range(5):
        assert await executors.call(http(f"{url}/echo")) == {"a": 1, "b": 2}
    await executors.call(http(f"{url}/add"))
    assert fake.calls["/echo"] == 5
    assert len(fake.client_ports) == 1  # six calls to one host, one TCP connection


async def test_builtins(executors: ToolExecutors) -> None:
    def builtin(name: str, args: dict[str, Any], deadline_s: float | None = None) -> ToolInvocation:
        return ToolInvocation("t", args, {"kind": "builtin", "name": name}, deadline_s, "s")

    assert await executors.call(builtin("echo", {"x": [1]})) == {"x": [1]}
    assert await executors.call(builtin("sleep", {"ms": 1})) == {"slept_ms": 1}
    assert (await failure(executors, builtin("sleep", {"ms": 5000}, 0.01))).reason == "timeout"
    assert (await failure(executors, builtin("sleep", {"ms": "x"}))).reason == "builtin"
    assert (await failure(executors, builtin("nope", {}))).reason == "builtin"
    assert {"echo", "sleep"} <= set(builtin_names())


async def test_targets() -> None:
    ex = ToolExecutors()
    assert ex.target_of(http("http://h.example:8001/a/b?q=1")) == "http:http://h.example:8001/a/b"
    assert ex.target_of(http("https://h.example/x")) == "http:https://h.example:443/x"
    assert ex.target_of(http("http://[::1]:9/t")) == "http:http://[::1]:9/t"
    assert ex.target_of(http("http://H.example")) == "http:http://h.example:80/"
    inv = ToolInvocation("t", {}, {"kind": "builtin", "name": "echo"}, None, "s")
    assert ex.target_of(inv) == "builtin:echo"
    with pytest.raises(ValueError, match="unknown kind"):
        await ex.call(ToolInvocation("t", {}, {"kind": "grpc"}, None, "s"))
    await ex.aclose()
