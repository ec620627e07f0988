"""Your own models: a pool's own price, and models no price covers.

Two OpenAI-compatible engines (the fake one) serve two pools read from a pools file, priced
by the shipped price tables: ``own-priced`` serves ``gpt-4o-mini`` (which the table lists)
at a price of its own; ``own-unpriced`` serves a fine-tune that nothing prices.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestratord.api.app import create_app
from orchestratord.pools.config import PoolConfigError, load_pools_file
from orchestratord.runtime import Orchestrator
from test_harness.fake_openai import FakeState, create_fake_openai
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import make_run, read_stream, wait_status
from tests.runs.test_transfer import serve

OWN_MODEL = "acme/finetune-7b"
IN_PER_M, OUT_PER_M = 3.0, 15.0  # the pool's price; the table has 0.15 / 0.60 for this model


@dataclass
class Rig:
    client: httpx.AsyncClient
    orch: Orchestrator


@pytest.fixture
async def rig(db_url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        listed = await stack.enter_async_context(
            serve_app(create_fake_openai(FakeState(model="gpt-4o-mini")))
        )
        own = await stack.enter_async_context(
            serve_app(create_fake_openai(FakeState(model=OWN_MODEL)))
        )
        pools = tmp_path / "pools.yaml"
        pools.write_text(
            f"""pools:
  - pool_id: own-priced
    engine: openai
    price: {{input_per_million_usd: {IN_PER_M}, output_per_million_usd: {OUT_PER_M}}}
    replicas: [{{replica_id: r1, url: "{listed}/v1", model: gpt-4o-mini, slots: 2}}]
  - pool_id: own-unpriced
    engine: openai
    replicas: [{{replica_id: r1, url: "{own}/v1", model: {OWN_MODEL}, slots: 2}}]
"""
        )
        orch = Orchestrator(make_settings(db_url, pools_file=pools))
        await orch.start()
        stack.push_async_callback(orch.stop)
        url = await stack.enter_async_context(serve_app(create_app(orchestrator=orch)))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield Rig(client, orch)


async def _step(
    client: httpx.AsyncClient,
    run_id: str,
    pool: str,
    token: str,
    *,
    max_tokens: int = 12,
    budgets: dict[str, Any] | None = None,
) -> httpx.Response:
    body: dict[str, Any] = {
        "type": "llm_call",
        "client_token": token,
        "input": {"prompt": "hi", "params": {"max_tokens": max_tokens, "temperature": 0.0}},
        "placement": {"pin": pool},
    }
    if budgets is not None:
        body["budgets"] = budgets
    return await client.post(f"/v1/runs/{run_id}/steps", json=body)


def _pool_cost(tokens_in: int, tokens_out: int) -> float:
    return round((tokens_in * IN_PER_M + tokens_out * OUT_PER_M) / 1_000_000, 9)


async def test_a_pool_price_wins_over_the_table_for_budgets_and_charges(rig: Rig) -> None:
    pool = (await rig.client.get("/v1/pools/own-priced")).json()
    assert pool["price"] == {"input_per_million_usd": IN_PER_M, "output_per_million_usd": OUT_PER_M}
    assert (await rig.client.get("/v1/pools/own-unpriced")).json()["price"] is None

    budget = 0.0001
    run_id = await make_run(rig.client, budgets={"max_cost_usd": budget})
    r = await _step(rig.client, run_id, "own-priced", "a", max_tokens=50)
    assert r.status_code == 202, r.text
    step = await wait_status(rig.client, r.json()["step_id"], "succeeded")

    # reserved at the pool's price: the table's $0.60/M would have fitted all 50 tokens
    tokens_in = step["usage"]["tokens_in"]
    fits = math.floor((budget - tokens_in * IN_PER_M / 1e6) / (OUT_PER_M / 1e6) + 1e-9)
    assert step["budget_clamped"] is True and step["max_tokens_granted"] == fits < 50
    tokens_out = step["usage"]["tokens_out"]
    assert tokens_out == fits
    cost = _pool_cost(tokens_in, tokens_out)
    assert step["usage"]["cost_usd"] == pytest.approx(cost)

    prov = step["provenance"]
    assert prov["cost_usd"] == step["usage"]["cost_usd"]
    assert prov["price"] == {
        "source": "pool",
        "pool_id": "own-priced",
        "input_per_million_usd": IN_PER_M,
        "output_per_million_usd": OUT_PER_M,
    }
    run = (await rig.client.get(f"/v1/runs/{run_id}")).json()
    assert prov["price_table"] == run["price_table"]  # pinned as ever; the pool's price won
    assert run["usage"]["cost_usd"] == pytest.approx(cost)
    assert run["usage"]["priced_cost_usd"] == run["usage"]["cost_usd"]
    assert run["usage"]["unpriced_steps"] == 0
    events = await read_stream(rig.client, f"/v1/steps/{step['step_id']}/stream")
    assert events[-1].event == "end" and events[-1].data is not None
    assert events[-1].data["provenance"] == prov
    assert not any(e.event == "narration" and "no price" in str(e.data) for e in events)


async def test_an_unpriced_model_runs_without_a_cost_budget_its_cost_null(rig: Rig) -> None:
    run_id = await make_run(rig.client)
    r = await _step(rig.client, run_id, "own-unpriced", "a")
    assert r.status_code == 202, r.text
    step = await wait_status(rig.client, r.json()["step_id"], "succeeded")
    assert step["usage"]["tokens_out"] == 12 and step["usage"]["tokens_in"] > 0
    assert step["usage"]["cost_usd"] is None  # not known: never a silent 0
    prov = step["provenance"]
    assert prov["cost_usd"] is None
    assert prov["price"] == {"source": "unpriced"}
    assert prov["model"] == OWN_MODEL

    events = await read_stream(rig.client, f"/v1/steps/{step['step_id']}/stream")
    assert events[0].event == "started"
    said = [e.data["text"] for e in events if e.event == "narration" and e.data]
    assert any(OWN_MODEL in text and "no price" in text and "not tracked" in text for text in said)
    end = events[-1]
    assert end.event == "end" and end.data is not None
    assert end.data["provenance"]["cost_usd"] is None
    assert end.data["provenance"] == prov

    run = (await rig.client.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["tokens_out"] == 12
    assert run["usage"]["cost_usd"] is None
    assert run["usage"]["priced_cost_usd"] == 0.0
    assert run["usage"]["unpriced_steps"] == 1


async def test_an_unpriced_model_is_refused_under_a_cost_budget(rig: Rig) -> None:
    budgeted = await make_run(rig.client, budgets={"max_cost_usd": 5.0})
    r = await _step(rig.client, budgeted, "own-unpriced", "a")
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "PRICE_UNKNOWN" and body["retriable"] is False
    price_table = (await rig.client.get(f"/v1/runs/{budgeted}")).json()["price_table"]
    assert body["details"] == {"engine": "openai", "model": OWN_MODEL, "price_table": price_table}

    # a step's own cost budget is one too; the same run takes the step without it
    free_run = await make_run(rig.client)
    r = await _step(rig.client, free_run, "own-unpriced", "a", budgets={"max_cost_usd": 5.0})
    assert r.status_code == 422 and r.json()["code"] == "PRICE_UNKNOWN"
    r = await _step(rig.client, free_run, "own-unpriced", "b")
    assert r.status_code == 202
    await wait_status(rig.client, r.json()["step_id"], "succeeded")
    for run_id in (budgeted, free_run):
        run = (await rig.client.get(f"/v1/runs/{run_id}")).json()
        assert run["step_count"] == (0 if run_id == budgeted else 1)


async def test_a_run_mixing_priced_and_unpriced_steps(rig: Rig, tmp_path: Path) -> None:
    run_id = await make_run(rig.client)
    priced = await _step(rig.client, run_id, "own-priced", "a")
    unpriced = await _step(rig.client, run_id, "own-unpriced", "b")
    a = await wait_status(rig.client, priced.json()["step_id"], "succeeded")
    b = await wait_status(rig.client, unpriced.json()["step_id"], "succeeded")
    assert a["usage"]["cost_usd"] == pytest.approx(
        _pool_cost(a["usage"]["tokens_in"], a["usage"]["tokens_out"])
    )
    assert b["usage"]["cost_usd"] is None

    run = (await rig.client.get(f"/v1/runs/{run_id}")).json()
    usage = run["usage"]
    assert usage["cost_usd"] is None  # one step's cost is not known, so neither is the total
    assert usage["priced_cost_usd"] == pytest.approx(a["usage"]["cost_usd"])
    assert usage["unpriced_steps"] == 1
    assert usage["tokens_out"] == a["usage"]["tokens_out"] + b["usage"]["tokens_out"]
    assert run["reserved"] == {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}

    # a gate sees the run's usage as the API shows it
    gate = await rig.client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "gate_eval",
            "client_token": "g",
            "input": {
                "expr": "run.usage.cost_usd == null && run.usage.unpriced_steps == 1"
                " && run.usage.priced_cost_usd > 0.0"
            },
        },
    )
    assert gate.status_code == 202, gate.text
    done = await wait_status(rig.client, gate.json()["step_id"], "succeeded")
    assert done["output"]["result"] is True

    # its record moves to another server as it is; a forged count of unpriced steps or cost
    # is refused
    done_run = await rig.client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
    assert done_run.status_code == 200, done_run.text
    bundle = (await rig.client.get(f"/v1/runs/{run_id}/export")).json()
    assert bundle["run"]["unpriced_steps"] == 1
    async with serve(f"sqlite:///{tmp_path / 'other.db'}") as other:
        for field, value in (("unpriced_steps", 0), ("cost_used_usd", 1.0)):
            forged = copy.deepcopy(bundle)
            forged["run"][field] = value
            r = await other.client.post("/v1/runs:import", json=forged)
            assert r.status_code == 422, r.text
            assert r.json()["details"]["errors"][0]["field"] == f"run.{field}"
        r = await other.client.post("/v1/runs:import", json=bundle)
        assert r.status_code == 201, r.text
        assert (await other.client.get(f"/v1/runs/{run_id}")).json()["usage"] == usage


_POOL = """pools:
  - pool_id: own
    engine: sim
    price: {price}
    replicas: [{{replica_id: r0}}]
"""


@pytest.mark.parametrize(
    ("price", "where", "says"),
    [
        (
            "{input_per_million_usd: -1, output_per_million_usd: 2}",
            "input_per_million_usd",
            "greater than or equal to 0",
        ),
        ("{per_decode_second_usd: .inf}", "per_decode_second_usd", "finite"),
        ("{per_decode_second_usd: .nan}", "per_decode_second_usd", "finite"),
        ('{per_decode_second_usd: "0.1"}', "per_decode_second_usd", "valid number"),
        ("{per_decode_second_usd: true}", "per_decode_second_usd", "valid number"),
        ("{input_per_mtok_usd: 1}", "input_per_mtok_usd", "Extra inputs"),
        ("{free: 1}", "free", "valid boolean"),
        ("{input_per_million_usd: 1}", "", "output_per_million_usd: required together"),
        ("{free: true, per_decode_second_usd: 1}", "", "more than one pricing form"),
        ("{free: false}", "", "free: must be true"),
        ("{}", "", "needs one pricing form"),
        ("0.5", "", "valid dictionary"),
    ],
)
def test_a_bad_price_in_the_pools_file_is_refused_naming_the_field(
    tmp_path: Path, price: str, where: str, says: str
) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(_POOL.format(price=price))
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    message = str(info.value)
    field = "pools.0.price" + (f".{where}" if where else "")
    assert message.startswith(f"{path}: {field} (line 4): "), message
    assert says in message


def test_a_good_price_in_the_pools_file(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    for price, kind in (
        ("{free: true}", "free"),
        ("{input_per_million_usd: 0, output_per_million_usd: 2}", "tokens"),
        ("{per_decode_second_usd: 0.00002}", "decode_seconds"),
    ):
        path.write_text(_POOL.format(price=price))
        (spec,) = load_pools_file(path)
        own = spec.own_price()
        assert own is not None and own.kind == kind and own.pool_id == "own"
    path.write_text(_POOL.format(price="null"))  # as if not given
    (spec,) = load_pools_file(path)
    assert spec.own_price() is None
