from __future__ import annotations

import httpx

from tests.helpers import make_flow


async def test_create_and_get_run(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    r = await client.post(
        f"/v1/flows/{flow_id}/runs",
        json={
            "seed": 9,
            "budgets": {"max_tokens_out": 100},
            "pool_policy": {"pin": "local"},
            "policy": {"rules": [{"id": "r1", "effect": "deny", "match": {"tool": "rm"}}]},
            "fs_policy": {"roots": ["/tmp/x"], "quota_files": 3},
        },
    )
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "running"
    assert run["mode"] == "record"
    assert run["seed"] == 9
    assert run["budgets"]["max_tokens_out"] == 100
    assert run["pool_policy"] == {"pin": "local"}
    assert run["usage"] == {
        "tokens_in": 0,
        "tokens_out": 0,
        "cost_usd": 0.0,
        "priced_cost_usd": 0.0,
        "unpriced_steps": 0,
    }
    got = (await client.get(f"/v1/runs/{run['run_id']}")).json()
    assert got == run


async def test_server_picks_and_records_a_seed(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    run = (await client.post(f"/v1/flows/{flow_id}/runs", json={})).json()
    assert isinstance(run["seed"], int)
    assert 0 <= run["seed"] < 2**32


async def test_run_of_unknown_flow(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/flows/flow_missing/runs", json={})
    assert r.status_code == 404


async def test_replay_needs_source(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"mode": "replay"})
    assert r.status_code == 422
    assert "source_run_id" in r.json()["message"]
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": "run_nope"}
    )
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "source_run_id"


async def test_bad_run_fields_are_named(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    cases = {
        "seed": {"seed": -1},
        "budgets.max_tokens_in": {"budgets": {"max_tokens_in": -5}},
        "mode": {"mode": "fast"},
        "policy.rules.0.effect": {"policy": {"rules": [{"id": "a", "effect": "maybe"}]}},
    }
    for field, body in cases.items():
        r = await client.post(f"/v1/flows/{flow_id}/runs", json=body)
        assert r.status_code == 422, (field, r.text)
        fields = [e["field"] for e in r.json()["details"]["errors"]]
        assert field in fields, (field, fields)


async def test_pin_to_unknown_pool(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    r = await client.post(f"/v1/flows/{flow_id}/runs", json={"pool_policy": {"pin": "gpu-z"}})
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "pool_policy.pin"
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"pool_policy": {"affinity": {"gpu": "h100"}}}
    )
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "pool_policy.affinity"


async def test_unknown_run_is_404(client: httpx.AsyncClient) -> None:
    for path in ("/v1/runs/run_x", "/v1/runs/run_x/facts", "/v1/runs/run_x/checkpoints"):
        r = await client.get(path)
        assert r.status_code == 404, path
        assert r.json()["code"] == "NOT_FOUND"
    r = await client.post("/v1/runs/run_x/cancel")
    assert r.status_code == 404
