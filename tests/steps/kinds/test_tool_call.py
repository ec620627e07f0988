"""tool_call through HTTP: args checked against the tool's schema, http and builtin
executors against a real tool server, failures, retries, policy, replay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from orchestrator_core import clock
from test_harness.fake_tools import FakeToolServer, refused_url
from test_harness.servers import serve_app
from tests.helpers import make_flow, make_run, read_run_stream, read_stream, wait_status

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def http_tool(
    name: str, url: str, schema: dict[str, Any] | None = None, **executor: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"the {name} tool",
        "parameters": schema or ANY_OBJECT,
        "executor": {"kind": "http", "url": url, **executor},
    }


def builtin_tool(name: str, builtin: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"builtin {builtin}",
        "parameters": schema or ANY_OBJECT,
        "executor": {"kind": "builtin", "name": builtin},
    }


@pytest.fixture
async def tools() -> AsyncIterator[tuple[FakeToolServer, str]]:
    server = FakeToolServer()
    async with serve_app(server.app) as url:
        yield server, url


async def call(
    client: httpx.AsyncClient,
    run_id: str,
    tool: str,
    args: dict[str, Any],
    token: str = "t",
    **extra: Any,
) -> httpx.Response:
    return await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "tool_call",
            "client_token": token,
            "input": {"tool": tool, "args": args},
            **extra,
        },
    )


async def run_with(client: httpx.AsyncClient, *tools: dict[str, Any], **run: Any) -> str:
    flow_id = await make_flow(client, tools=list(tools))
    return await make_run(client, flow_id, **run)


async def test_builtin_echo_gives_output_fact_and_events(live: httpx.AsyncClient) -> None:
    client = live
    run_id = await run_with(client, builtin_tool("echo", "echo"))
    r = await call(client, run_id, "echo", {"text": "hi", "n": [1, 2]})
    assert r.status_code == 202, r.text
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["status"] == "succeeded", step
    assert step["output"]["result"] == {"text": "hi", "n": [1, 2]}
    assert step["provenance"]["tool"] == "echo"
    assert step["provenance"]["engine"] == "tool:builtin"
    assert step["pool_id"] is None
    events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
    assert [e.event for e in events] == ["started", "fact", "end"]
    assert [e.data["seq"] for e in events if e.data] == [0, 1, 2]
    fact = events[1].data
    assert fact is not None and fact["fact_type"] == "tool_result"
    assert fact["data"] == {
        "tool": "echo",
        "args": {"text": "hi", "n": [1, 2]},
        "result": step["output"]["result"],
    }
    facts = (await client.get(f"/v1/runs/{run_id}/facts", params={"type": "tool_result"})).json()
    assert [f["data"] for f in facts] == [fact["data"]]
    assert facts[0]["emitted_by_step"] == step["step_id"]
    run_events = await read_run_stream(live, run_id, 3)  # the fact once, as the step's event
    assert [e.event for e in run_events] == ["started", "fact", "end"]


async def test_http_tool_posts_the_args_and_returns_the_reply(
    client: httpx.AsyncClient, tools: tuple[FakeToolServer, str]
) -> None:
    server, url = tools
    run_id = await run_with(client, http_tool("add", f"{url}/add", ADD_SCHEMA))
    r = await call(client, run_id, "add", {"a": 2, "b": 40})
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["output"]["result"] == {"sum": 42}, step
    assert server.calls["/add"] == 1
    assert server.last_idempotency_key == step["step_id"]
    again = await call(client, run_id, "add", {"a": 2, "b": 40})  # the same client_token
    assert again.status_code == 200 and again.json()["step_id"] == step["step_id"]
    assert server.calls["/add"] == 1  # never run twice


@pytest.mark.parametrize(
    ("args", "pointers"),
    [
        ({"a": "x"}, ["/a", "/b"]),
        ({"a": 1, "b": 2, "c": 3}, ["/c"]),
        ({}, ["/a", "/b"]),
    ],
)
async def test_bad_args_are_refused_with_every_pointer(
    client: httpx.AsyncClient, args: dict[str, Any], pointers: list[str]
) -> None:
    run_id = await run_with(client, builtin_tool("add", "echo", ADD_SCHEMA))
    r = await call(client, run_id, "add", args)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "TOOL_ARGS_INVALID"
    assert [e["pointer"] for e in body["details"]["errors"]] == pointers
    assert all(e["message"] for e in body["details"]["errors"])
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 0  # nothing stored


@pytest.mark.parametrize(
    ("step_input", "field"),
    [
        ({"tool": "nope", "args": {}}, "input.tool"),
        ({"args": {}}, "input.tool"),
        ({"tool": "echo", "args": []}, "input.args"),
        ({"tool": "echo", "args": {}, "extra": 1}, "input.extra"),
    ],
)
async def test_bad_tool_input_names_the_field(
    client: httpx.AsyncClient, step_input: dict[str, Any], field: str
) -> None:
    run_id = await run_with(client, builtin_tool("echo", "echo"))
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "tool_call", "client_token": "x", "input": step_input},
    )
    assert r.status_code == 422, r.text
    body = r.json()
    fields = [e["field"] for e in body["details"].get("errors", [])] or [
        body["details"].get("field")
    ]
    assert field in fields, body


@pytest.mark.parametrize(
    ("path", "executor", "reason"),
    [
        ("/slow?ms=2000", {"timeout_ms": 50}, "timeout"),
        ("/status/500", {}, "status"),
        ("/big?bytes=5000", {"max_reply_bytes": 1000}, "too_large"),
        ("/invalid-json", {}, "invalid_json"),
    ],
)
async def test_a_failing_tool_ends_the_step_with_tool_error(
    client: httpx.AsyncClient,
    tools: tuple[FakeToolServer, str],
    path: str,
    executor: dict[str, Any],
    reason: str,
) -> None:
    _, url = tools
    run_id = await run_with(client, http_tool("t", f"{url}{path}", **executor))
    r = await call(client, run_id, "t", {})
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["status"] == "failed"
    assert step["error"]["code"] == "TOOL_ERROR"
    assert step["error"]["details"]["reason"] == reason
    events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
    assert [e.event for e in events] == ["started", "error"]
    facts = (await client.get(f"/v1/runs/{run_id}/facts")).json()
    assert facts == []


async def test_a_refused_connection_is_a_tool_error(client: httpx.AsyncClient) -> None:
    run_id = await run_with(client, http_tool("t", refused_url()))
    r = await call(client, run_id, "t", {})
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["error"]["code"] == "TOOL_ERROR"
    assert step["error"]["details"]["reason"] == "connect"


@pytest.mark.parametrize(
    ("idempotent", "calls", "status"), [(True, 3, "succeeded"), (None, 1, "failed")]
)
async def test_retried_only_when_idempotent(
    client: httpx.AsyncClient,
    tools: tuple[FakeToolServer, str],
    idempotent: bool | None,
    calls: int,
    status: str,
) -> None:
    server, url = tools
    executor: dict[str, Any] = {"max_retries": 3}
    if idempotent is not None:
        executor["idempotent"] = idempotent
    run_id = await run_with(
        client, http_tool("flaky", f"{url}/flaky?fail=2&bucket={status}", **executor)
    )
    r = await call(client, run_id, "flaky", {"q": 1})
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["status"] == status, step
    assert server.calls["/flaky"] == calls
    events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
    narrations = [e for e in events if e.event == "narration"]
    assert len(narrations) == calls - 1
    if narrations:
        assert "retrying tool flaky" in narrations[0].data["text"]  # type: ignore[index]


async def test_policy_denies_a_tool_by_name(client: httpx.AsyncClient) -> None:
    run_id = await run_with(
        client,
        builtin_tool("echo", "echo"),
        builtin_tool("rm", "echo"),
        policy={"rules": [{"id": "no-rm", "effect": "deny", "match": {"tool": "rm"}}]},
    )
    r = await call(client, run_id, "rm", {"path": "/"})
    assert r.status_code == 403, r.text
    assert r.json()["code"] == "POLICY_DENIED"
    assert "no-rm" in r.json()["message"]
    ok = await call(client, run_id, "echo", {"x": 1}, token="t2")
    assert ok.status_code == 202


async def test_redaction_masks_args_and_result(client: httpx.AsyncClient) -> None:
    run_id = await run_with(
        client,
        builtin_tool("echo", "echo"),
        policy={
            "rules": [
                {
                    "id": "keys",
                    "effect": "redact",
                    "match": {"step_type": "tool_call"},
                    "pattern": "sk-[a-z0-9]+",
                }
            ]
        },
    )
    r = await call(client, run_id, "echo", {"key": "sk-abc123", "note": "fine"})
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert "sk-abc123" not in str(step)
    assert step["input"]["args"]["note"] == "fine"
    facts = (await client.get(f"/v1/runs/{run_id}/facts")).json()
    assert "sk-abc123" not in str(facts)
    events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
    assert "sk-abc123" not in str([e.data for e in events])


async def test_the_wall_budget_bounds_the_call(client: httpx.AsyncClient) -> None:
    run_id = await run_with(client, builtin_tool("sleep", "sleep"))
    r = await call(client, run_id, "sleep", {"ms": 20000}, budgets={"max_wall_ms": 100})
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["status"] == "failed"
    assert step["error"]["code"] == "TOOL_ERROR"
    assert step["error"]["details"]["reason"] in ("budget", "timeout")


async def test_cancel_stops_a_running_tool(client: httpx.AsyncClient) -> None:
    run_id = await run_with(client, builtin_tool("sleep", "sleep"))
    r = await call(client, run_id, "sleep", {"ms": 20000})
    step_id = r.json()["step_id"]
    await wait_status(client, step_id, "running")
    assert (await client.post(f"/v1/steps/{step_id}/cancel")).status_code == 202
    await wait_status(client, step_id, "cancelled")
    events = await read_stream(client, f"/v1/steps/{step_id}/stream")
    assert events[-1].event == "end" and events[-1].data["stop_reason"] == "cancelled"  # type: ignore[index]


@pytest.mark.parametrize("mode", ["replay", "strict_replay"])
async def test_replay_serves_the_recorded_result_without_a_call(
    client: httpx.AsyncClient, tools: tuple[FakeToolServer, str], mode: str
) -> None:
    server, url = tools
    flow_id = await make_flow(client, tools=[http_tool("add", f"{url}/add", ADD_SCHEMA)])
    source = await make_run(client, flow_id)
    first = await call(client, source, "add", {"a": 1, "b": 2})
    recorded = await wait_status(client, first.json()["step_id"], "succeeded")
    assert server.calls["/add"] == 1
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"mode": mode, "source_run_id": source})
    assert r.status_code == 201, r.text
    replay = r.json()["run_id"]
    again = await call(client, replay, "add", {"a": 1, "b": 2})
    step = await wait_status(client, again.json()["step_id"], "succeeded", "failed")
    assert step["output"] == recorded["output"]
    assert step["replay_outcome"] == "identical"
    assert server.calls["/add"] == 1  # not called again
    facts = (await client.get(f"/v1/runs/{replay}/facts")).json()
    assert [f["data"]["result"] for f in facts] == [{"sum": 3}]
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"mode": mode, "source_run_id": source})
    other = r.json()["run_id"]
    miss = await call(client, other, "add", {"a": 1, "b": 3})  # position 0, other args
    missed = await wait_status(client, miss.json()["step_id"], "succeeded", "failed")
    assert missed["error"]["code"] == "REPLAY_MISS"
    assert "prompt_hash" in missed["error"]["details"]["differs"]
    assert server.calls["/add"] == 1


@pytest.fixture
def settings(db_url: str) -> Any:
    from tests.conftest import make_settings

    return make_settings(db_url, breakers={"tool_failures": 2, "open_s": 60})


async def test_breaker_opens_fails_fast_half_opens_and_closes(
    live: httpx.AsyncClient, tools: tuple[FakeToolServer, str], skewed: clock.SkewedClock
) -> None:
    client = live
    server, url = tools
    run_id = await run_with(client, http_tool("t", f"{url}/echo"))
    server.down()
    ends = []
    for i in range(2):
        r = await call(client, run_id, "t", {"i": i}, token=f"down{i}")
        ends.append(await wait_status(client, r.json()["step_id"], "succeeded", "failed"))
    assert [s["error"]["code"] for s in ends] == ["TOOL_ERROR", "TOOL_ERROR"]
    opened = await read_stream(client, f"/v1/steps/{ends[1]['step_id']}/stream")
    escalations = [e.data for e in opened if e.event == "escalation"]
    assert len(escalations) == 1
    assert escalations[0] is not None
    assert escalations[0]["state"] == "open" and escalations[0]["failures"] == 2
    assert escalations[0]["target"].startswith("http:")
    before = server.calls["/echo"]
    r = await call(client, run_id, "t", {"i": 9}, token="fast")
    fast = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert fast["error"]["code"] == "CIRCUIT_OPEN"
    assert fast["error"]["retriable"] is True
    assert fast["error"]["retry_after_ms"] > 0
    assert server.calls["/echo"] == before  # failed fast: not called
    run_events = await read_run_stream(client, run_id, 7)
    assert [e.data["state"] for e in run_events if e.event == "escalation" and e.data] == ["open"]
    server.up()
    skewed.advance(61)  # past the breaker's open_s (60)
    r = await call(client, run_id, "t", {"i": 10}, token="trial")
    trial = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert trial["status"] == "succeeded"
    states = [
        e.data["state"]
        for e in await read_stream(client, f"/v1/steps/{trial['step_id']}/stream")
        if e.event == "escalation" and e.data
    ]
    assert states == ["half_open", "closed"]
