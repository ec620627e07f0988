"""gate_eval: CEL over the run's facts; errors with positions; waiting gates woken by facts."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import (
    follower_waits,
    make_flow,
    make_run,
    read_stream,
    started_client,
    submit,
    until,
    wait_status,
)


async def gate(
    client: httpx.AsyncClient, run_id: str, expr: str, token: str = "g", **extra: Any
) -> httpx.Response:
    return await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "gate_eval", "client_token": token, "input": {"expr": expr, **extra}},
    )


async def fact(client: httpx.AsyncClient, run_id: str, kind: str, data: Any) -> None:
    r = await client.post(f"/v1/runs/{run_id}/facts", json={"type": kind, "data": data})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("expr", "result"),
    [
        ('facts.exists(f, f.type == "score" && f.data.value > 5)', True),
        ('facts.exists(f, f.type == "score" && f.data.value > 50)', False),
        ("size(facts) == 2", True),
        ('run.run_id != ""', True),
        ("true", True),
        ("false", False),
    ],
)
async def test_gates_true_and_false(client: httpx.AsyncClient, expr: str, result: bool) -> None:
    run_id = await make_run(client)
    await fact(client, run_id, "score", {"value": 7})
    await fact(client, run_id, "note", {"text": "hi"})
    r = await gate(client, run_id, expr)
    assert r.status_code == 202, r.text
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["status"] == "succeeded", step
    assert step["output"]["result"] is result
    events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
    assert [e.event for e in events] == ["started", "fact", "end"]
    facts = (await client.get(f"/v1/runs/{run_id}/facts", params={"type": "gate_result"})).json()
    assert [f["data"] for f in facts] == [{"expr": expr, "result": result}]


@pytest.mark.parametrize(
    ("expr", "column"),
    [
        ("facts.exists(f, f.type == ", 27),
        ("nope && true", 1),
        ("size(facts)", 1),
        ("1 +", 4),
    ],
)
async def test_malformed_gates_are_refused_with_the_position(
    client: httpx.AsyncClient, expr: str, column: int
) -> None:
    run_id = await make_run(client)
    r = await gate(client, run_id, expr)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "GATE_EXPR_INVALID"
    assert body["details"]["field"] == "input.expr"
    assert body["details"]["line"] == 1 and body["details"]["column"] == column
    assert (await client.get(f"/v1/runs/{run_id}")).json()["step_count"] == 0


@pytest.mark.parametrize("expr", ["run.usage.tokens_in", "run.nothing == 1"])
async def test_a_value_that_is_no_boolean_fails_the_step(
    client: httpx.AsyncClient, expr: str
) -> None:
    run_id = await make_run(client)
    step = await wait_status(
        client, (await gate(client, run_id, expr)).json()["step_id"], "succeeded", "failed"
    )
    assert step["status"] == "failed"
    assert step["error"]["code"] == "GATE_EXPR_INVALID"


async def test_a_waiting_gate_is_woken_by_a_fact(
    client: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = follower_waits(orch, monkeypatch)
    run_id = await make_run(client)
    r = await gate(client, run_id, 'facts.exists(f, f.type == "done")', wait_ms=60_000)
    step_id = r.json()["step_id"]
    await wait_status(client, step_id, "running")
    await asyncio.wait_for(waits.wait(), 10)  # evaluated false, it waits for a fact
    assert (await client.get(f"/v1/steps/{step_id}")).json()["status"] == "running"
    await fact(client, run_id, "other", 1)  # wakes it: still false
    await fact(client, run_id, "done", 1)
    # a gate that was not woken would wait its 60 s: wait_status gives up long before
    step = await wait_status(client, step_id, "succeeded", "failed")
    assert step["output"]["result"] is True


async def test_a_waiting_gate_ends_false_when_the_wait_runs_out(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    r = await gate(client, run_id, 'facts.exists(f, f.type == "never")', wait_ms=150)
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["status"] == "succeeded" and step["output"]["result"] is False
    assert step["pool_id"] is None  # it held no engine slot


async def test_a_waiting_gate_can_be_cancelled(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    r = await gate(client, run_id, "false", wait_ms=60_000)
    step_id = r.json()["step_id"]
    await wait_status(client, step_id, "running")
    await client.post(f"/v1/steps/{step_id}/cancel")
    assert (await wait_status(client, step_id, "cancelled"))["status"] == "cancelled"


async def test_replay_serves_the_recorded_gate(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    source = await make_run(client, flow_id)
    await fact(client, source, "x", 1)
    recorded = await wait_status(
        client, (await gate(client, source, "size(facts) > 0")).json()["step_id"], "succeeded"
    )
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": source}
    )
    replay = r.json()["run_id"]  # no facts here: a re-evaluation would say false
    served = await wait_status(
        client, (await gate(client, replay, "size(facts) > 0")).json()["step_id"], "succeeded"
    )
    assert served["output"] == recorded["output"] and served["output"]["result"] is True
    assert served["replay_outcome"] == "identical"


async def test_an_expression_past_the_cost_limit_fails_the_step(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    for n in range(120):
        await fact(client, run_id, "n", n)
    expr = "facts.exists(a, facts.exists(b, a.data == b.data + 1000))"  # 120 x 120 iterations
    step = await wait_status(
        client, (await gate(client, run_id, expr)).json()["step_id"], "succeeded", "failed"
    )
    assert step["status"] == "failed"
    assert step["error"]["code"] == "GATE_EXPR_INVALID"
    assert step["error"]["details"]["reason"] == "budget"


ISSUE_EXPR = (
    f"{list(range(48))}.map(x, {list(range(32))}.map(y, facts[0].data.s + facts[0].data.s))"
    ".size() > 0"
)


async def test_an_expression_that_would_build_huge_values_is_refused_at_submission(
    client: httpx.AsyncClient,
) -> None:
    """The issue's gate: 1,536 concatenations of twice a fact, known before any fact."""
    run_id = await make_run(client)
    r = await gate(client, run_id, ISSUE_EXPR)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "GATE_EXPR_INVALID"
    assert body["details"]["field"] == "input.expr" and body["details"]["reason"] == "cost"
    assert body["details"]["column"] == ISSUE_EXPR.index("+") + 1
    assert (await client.get(f"/v1/runs/{run_id}")).json()["step_count"] == 0


async def test_a_gate_whose_estimate_over_its_facts_passes_the_limit_fails_unevaluated(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    """Admitted (48 copies of what it reads), but over a 3 MB fact that is past 128 MiB."""
    run_id = await make_run(client)
    await fact(client, run_id, "big", {"s": "x" * 3_000_000})
    expr = f'{list(range(24))}.exists(i, facts[0].data.s + facts[0].data.s == "")'
    step = await wait_status(
        client, (await gate(client, run_id, expr)).json()["step_id"], "succeeded", "failed"
    )
    assert step["status"] == "failed"
    assert step["error"]["code"] == "GATE_EXPR_INVALID"
    assert step["error"]["details"]["reason"] == "cost"
    assert orch.services.cel.evaluations == 0  # no process was asked


async def test_waiting_gates_evaluate_when_facts_arrive_not_on_tokens(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    """Four gates wait over 300 facts while a 2,000-token llm_call streams in their run:
    each evaluates once at its start, and at most once when the call's end settles its
    usage and once per fact appended after (fewer when the pace gathers them); never per
    token."""
    run_id = await make_run(client)
    for i in range(300):
        await fact(client, run_id, "n", i)
    pool = orch.services.cel
    expr = 'facts.exists(f, f.type == "done")'
    gates = [
        (await gate(client, run_id, expr, f"g{g}", wait_ms=60_000)).json()["step_id"]
        for g in range(4)
    ]
    await until(lambda: pool.evaluations >= 4, tries=500)
    assert pool.evaluations == 4
    r = await submit(client, run_id, "call", max_tokens=2000)
    call = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert call["status"] == "succeeded" and call["usage"]["tokens_out"] == 2000
    await fact(client, run_id, "other", 1)
    await fact(client, run_id, "done", 1)
    for step_id in gates:
        step = await wait_status(client, step_id, "succeeded", "failed")
        assert step["output"]["result"] is True
    assert pool.evaluations <= 4 * (1 + 1 + 2)
    # woken together, the four read the run's facts once per change
    assert pool.reads.reads <= 4 + 1 + 2


async def test_a_waiting_gate_is_woken_by_a_fact_a_step_appends(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    """A tool call's ``tool_result`` is streamed before its row is stored with the step's
    end: the gate sees it once it is there."""
    echo = {
        "name": "echo",
        "description": "echo",
        "parameters": {"type": "object"},
        "executor": {"kind": "builtin", "name": "echo"},
    }
    run_id = await make_run(client, await make_flow(client, tools=[echo]))
    expr = 'facts.exists(f, f.type == "tool_result")'
    step_id = (await gate(client, run_id, expr, wait_ms=60_000)).json()["step_id"]
    await until(lambda: orch.services.cel.evaluations >= 1, tries=500)
    call = {"type": "tool_call", "client_token": "t", "input": {"tool": "echo", "args": {}}}
    assert (await client.post(f"/v1/runs/{run_id}/steps", json=call)).status_code == 202
    step = await wait_status(client, step_id, "succeeded", "failed")
    assert step["output"]["result"] is True


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_gate_sees_the_latest_facts_that_fit_its_input_bytes(db_url: str) -> None:
    """Ten facts of ~1.5 KB, 4 KiB of input: the latest two (with ``run``) fit."""
    settings = make_settings(db_url, cel={"max_input_bytes": 4096})
    async with started_client(Orchestrator(settings)) as client:
        run_id = await make_run(client)
        for i in range(10):
            await fact(client, run_id, "n", {"i": i, "pad": "x" * 1500})
        expr = "size(facts) == 2 && facts[0].data.i == 8 && facts[1].data.i == 9"
        step = await wait_status(
            client, (await gate(client, run_id, expr)).json()["step_id"], "succeeded", "failed"
        )
        assert step["output"]["result"] is True, step
