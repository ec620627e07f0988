"""Budgets: reserved before a step runs, enforced while it runs, settled when it ends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator_core import clock
from orchestratord.runtime import Orchestrator
from tests.helpers import make_run, read_stream, submit, wait_status
from worker_adapters.sim import SimAdapter


async def test_tokens_out_is_clamped_and_stops_with_budget(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client, budgets={"max_tokens_out": 30})
    a = await submit(client, run_id, token="a", max_tokens=20)
    assert a.status_code == 202
    assert a.headers["X-Budget-Tokens-Remaining"] == "10"
    b = await submit(client, run_id, token="b", max_tokens=20)
    assert b.status_code == 202
    step_b = await wait_status(client, b.json()["step_id"], "succeeded")
    assert step_b["max_tokens_granted"] == 10 and step_b["budget_clamped"] is True
    assert step_b["usage"]["tokens_out"] == 10
    events = await read_stream(client, f"/v1/steps/{b.json()['step_id']}/stream")
    assert events[-1].data is not None and events[-1].data["stop_reason"] == "budget"
    await wait_status(client, a.json()["step_id"], "succeeded")
    refused = await submit(client, run_id, token="c", max_tokens=5)
    assert refused.status_code == 409
    body = refused.json()
    assert body["code"] == "BUDGET_EXCEEDED"
    assert body["details"]["limit"] == "max_tokens_out"
    assert body["details"]["remaining"]["tokens_out"] == 0
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["tokens_out"] == 30
    assert run["reserved"] == {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}


async def test_refusal_while_held_by_running_steps_is_retriable(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    _slow(orch, rate=1.0)  # the first step holds its reservation until it is cancelled
    run_id = await make_run(client, budgets={"max_tokens_out": 10})
    first = await submit(client, run_id, token="a", max_tokens=10)
    assert first.status_code == 202
    r = await submit(client, run_id, token="b", max_tokens=5)
    assert r.status_code == 409
    assert r.json()["retriable"] is True  # it may fit once the first step settles
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["reserved"]["tokens_out"] == 10
    await client.post(f"/v1/steps/{first.json()['step_id']}/cancel")
    await wait_status(client, first.json()["step_id"], "cancelled")


async def test_step_budget_narrows_the_run(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client, budgets={"max_tokens_out": 100})
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "s",
            "budgets": {"max_tokens_out": 4},
            "input": {"prompt": "x", "params": {"max_tokens": 50}},
        },
    )
    step = await wait_status(client, r.json()["step_id"], "succeeded")
    assert step["max_tokens_granted"] == 4 and step["usage"]["tokens_out"] == 4
    assert step["budgets"]["max_tokens_out"] == 4


async def test_tokens_in_is_counted_with_the_engine_tokenizer(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client, budgets={"max_tokens_in": 5})
    ok = await submit(client, run_id, token="a", prompt="one two three")
    assert ok.status_code == 202
    step = await wait_status(client, ok.json()["step_id"], "succeeded")
    assert step["reserved"]["tokens_in"] == 3 and step["usage"]["tokens_in"] == 3
    too_long = await submit(client, run_id, token="b", prompt="a b c d e f g")
    assert too_long.status_code == 409
    assert too_long.json()["details"]["limit"] == "max_tokens_in"
    assert too_long.json()["details"]["remaining"]["tokens_in"] == 2
    step_limit = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "c",
            "budgets": {"max_tokens_in": 1},
            "input": {"prompt": "a b"},
        },
    )
    assert step_limit.status_code == 409
    assert step_limit.json()["details"]["scope"] == "step"


async def test_wall_budget_stops_a_running_step(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    _slow(orch)
    run_id = await make_run(client)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "w",
            "budgets": {"max_wall_ms": 300},
            "input": {"prompt": "x", "params": {"max_tokens": 1000}},
        },
    )
    step = await wait_status(client, r.json()["step_id"], "succeeded")
    assert step["output"]["stop_reason"] == "budget"
    assert 0 < step["usage"]["tokens_out"] < 1000
    events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
    assert events[-1].data is not None and events[-1].data["stop_reason"] == "budget"


async def test_run_wall_budget_refuses_late_steps(
    client: httpx.AsyncClient, skewed: clock.SkewedClock
) -> None:
    # long enough that the first submission lands inside it on a loaded machine (at 150 ms
    # a slow PostgreSQL submission was itself refused, and its 409 carries no such header)
    run_id = await make_run(client, budgets={"max_wall_ms": 1500})
    r = await submit(client, run_id, token="a")
    assert r.headers["X-Budget-Time-Remaining-Ms"].isdigit()
    skewed.advance(1.6)  # the run's wall clock passes its budget
    late = await submit(client, run_id, token="b")
    assert late.status_code == 409
    assert late.json()["details"]["limit"] == "max_wall_ms"


def _slow(orch: Orchestrator, rate: float = 40.0) -> None:
    adapter = orch.pools.pools["local"].replicas[0].adapter
    assert isinstance(adapter, SimAdapter)
    adapter.tokens_per_s = rate


@pytest.fixture
def priced(tmp_path: Path) -> Path:
    """Two price tables in which the sim model costs money per token."""
    d = tmp_path / "prices"
    d.mkdir()
    for version, out_price in (("2026-01-01", 1000.0), ("2026-02-01", 2000.0)):
        (d / f"{version}.yaml").write_text(
            f'version: "{version}"\nunpriced: refuse\nentries:\n'
            f"  - {{engine: sim, model: sim-1, input_per_million_usd: 100.0,"
            f" output_per_million_usd: {out_price}}}\n"
        )
    return d


async def _priced_client(db_url: str, prices: Path, **settings: Any) -> tuple[Orchestrator, Any]:
    from orchestratord.api.app import create_app
    from tests.conftest import make_settings

    orch = Orchestrator(make_settings(db_url, price_tables_dir=prices, **settings))
    await orch.start()
    transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
    return orch, httpx.AsyncClient(transport=transport, base_url="http://t")


async def test_cost_budget_and_pinned_price_table(db_url: str, priced: Path) -> None:
    orch, client = await _priced_client(db_url, priced, price_table="2026-01-01")
    try:
        run_id = await make_run(client, budgets={"max_cost_usd": 0.01})
        run = (await client.get(f"/v1/runs/{run_id}")).json()
        assert run["price_table"] == "2026-01-01"
        # 1 prompt token at $100/M + n output tokens at $1000/M <= $0.01 -> n <= 9
        r = await submit(client, run_id, token="a", prompt="hi", max_tokens=50)
        assert r.status_code == 202
        step = await wait_status(client, r.json()["step_id"], "succeeded")
        assert step["max_tokens_granted"] == 9 and step["budget_clamped"]
        assert step["usage"]["cost_usd"] == pytest.approx(0.0001 * 1 + 0.001 * 9)
        assert step["provenance"]["cost_usd"] == step["usage"]["cost_usd"]
        assert step["provenance"]["price_table"] == "2026-01-01"
        assert r.headers["X-Budget-Cost-Remaining"] == "0.0009"  # 0.01 - worst case 0.0091
        refused = await submit(client, run_id, token="b", prompt="hi")
        assert refused.status_code == 409
        assert refused.json()["details"]["limit"] == "max_cost_usd"
    finally:
        await client.aclose()
        await orch.stop()
    # a server started later with a newer table: old runs keep theirs, new runs get the new one
    orch, client = await _priced_client(db_url, priced)
    try:
        assert (await client.get(f"/v1/runs/{run_id}")).json()["price_table"] == "2026-01-01"
        new_run = await make_run(client)
        assert (await client.get(f"/v1/runs/{new_run}")).json()["price_table"] == "2026-02-01"
        r = await submit(client, new_run, token="a", prompt="hi", max_tokens=3)
        step = await wait_status(client, r.json()["step_id"], "succeeded")
        assert step["usage"]["cost_usd"] == pytest.approx(0.0001 + 0.002 * 3)
    finally:
        await client.aclose()
        await orch.stop()


async def test_unpriced_model_is_refused_not_free(db_url: str, tmp_path: Path) -> None:
    """Under a cost budget; without one it runs (tests/prices/test_own_model_pricing.py)."""
    d = tmp_path / "p"
    d.mkdir()
    (d / "2026-01-01.yaml").write_text('version: "2026-01-01"\nunpriced: refuse\nentries: []\n')
    orch, client = await _priced_client(db_url, d)
    try:
        run_id = await make_run(client, budgets={"max_cost_usd": 1.0})
        r = await submit(client, run_id)
        assert r.status_code == 422
        assert r.json()["code"] == "PRICE_UNKNOWN"
        assert r.json()["details"] == {
            "engine": "sim",
            "model": "sim-1",
            "price_table": "2026-01-01",
        }
    finally:
        await client.aclose()
        await orch.stop()


async def test_many_concurrent_steps_never_overspend(client: httpx.AsyncClient) -> None:
    """500 steps race for one run's budget in one process; the two-process case is in
    tests/runs/test_budget_processes.py."""
    run_id = await make_run(client, budgets={"max_tokens_out": 1000, "max_tokens_in": 100000})

    async def one(i: int) -> httpx.Response:
        return await submit(client, run_id, token=f"c{i}", prompt="p q", max_tokens=7)

    responses = await asyncio.gather(*(one(i) for i in range(500)))
    accepted = [r for r in responses if r.status_code == 202]
    refused = [r for r in responses if r.status_code != 202]
    assert {r.status_code for r in refused} <= {409}
    assert all(r.json()["code"] == "BUDGET_EXCEEDED" for r in refused)
    for r in accepted:
        await wait_status(client, r.json()["step_id"], "succeeded")
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["tokens_out"] <= 1000
    per_step = [
        (await client.get(f"/v1/steps/{r.json()['step_id']}")).json()["usage"]["tokens_out"]
        for r in accepted
    ]
    assert run["usage"]["tokens_out"] == sum(per_step)
    assert run["usage"]["tokens_out"] >= 994  # the budget is used, not left idle
    assert run["reserved"]["tokens_out"] == 0
