from __future__ import annotations

import httpx

from tests.helpers import make_flow, make_run, submit, wait_status

SCHEMAS = {
    "fact_schemas": {
        "score": {
            "type": "object",
            "properties": {"value": {"type": "number"}},
            "required": ["value"],
        }
    }
}


async def test_facts_append_filter_and_page(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    ids = []
    for i in range(5):
        r = await client.post(
            f"/v1/runs/{run_id}/facts",
            json={"type": "even" if i % 2 == 0 else "odd", "data": {"i": i}},
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["fact_id"])
    all_facts = (await client.get(f"/v1/runs/{run_id}/facts")).json()
    assert [f["fact_id"] for f in all_facts] == ids
    assert [f["data"]["i"] for f in all_facts] == [0, 1, 2, 3, 4]
    evens = (await client.get(f"/v1/runs/{run_id}/facts", params={"type": "even"})).json()
    assert [f["data"]["i"] for f in evens] == [0, 2, 4]
    page1 = await client.get(f"/v1/runs/{run_id}/facts", params={"limit": 2})
    assert [f["data"]["i"] for f in page1.json()] == [0, 1]
    cursor = page1.headers["X-Next-After"]
    page2 = await client.get(f"/v1/runs/{run_id}/facts", params={"limit": 2, "after": cursor})
    assert [f["data"]["i"] for f in page2.json()] == [2, 3]
    last = await client.get(
        f"/v1/runs/{run_id}/facts", params={"after": page2.headers["X-Next-After"]}
    )
    assert [f["data"]["i"] for f in last.json()] == [4]
    assert "X-Next-After" not in last.headers
    bad = await client.get(f"/v1/runs/{run_id}/facts", params={"after": "fact_nope"})
    assert bad.status_code == 422
    assert bad.json()["details"]["errors"][0]["field"] == "query.after"


async def test_facts_are_validated_against_flow_schemas(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client, config=SCHEMAS)
    run_id = await make_run(client, flow_id)
    ok = await client.post(
        f"/v1/runs/{run_id}/facts", json={"type": "score", "data": {"value": 0.5}}
    )
    assert ok.status_code == 201
    bad = await client.post(
        f"/v1/runs/{run_id}/facts", json={"type": "score", "data": {"value": "high"}}
    )
    assert bad.status_code == 422
    assert bad.json()["details"]["errors"][0]["field"] == "data.value"
    missing = await client.post(f"/v1/runs/{run_id}/facts", json={"type": "score", "data": {}})
    assert missing.status_code == 422
    facts = (await client.get(f"/v1/runs/{run_id}/facts")).json()
    assert len(facts) == 1  # refused facts were not stored


async def test_fact_from_a_step(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    step_id = (await submit(client, run_id)).json()["step_id"]
    r = await client.post(
        f"/v1/runs/{run_id}/facts",
        json={"type": "t", "data": 1, "step_id": step_id, "schema_uri": "urn:x"},
    )
    assert r.status_code == 201
    assert r.json()["emitted_by_step"] == step_id
    assert r.json()["schema_uri"] == "urn:x"
    other = await make_run(client)
    r = await client.post(
        f"/v1/runs/{other}/facts", json={"type": "t", "data": 1, "step_id": step_id}
    )
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "step_id"


async def test_facts_have_no_update_or_delete(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    fact_id = (await client.post(f"/v1/runs/{run_id}/facts", json={"type": "t", "data": 1})).json()[
        "fact_id"
    ]
    for method in ("PUT", "PATCH", "DELETE"):
        r = await client.request(method, f"/v1/runs/{run_id}/facts/{fact_id}")
        assert r.status_code in (404, 405)
    r = await client.request("DELETE", f"/v1/runs/{run_id}/facts")
    assert r.status_code == 405
    assert r.json()["code"] == "METHOD_NOT_ALLOWED"


async def test_checkpoints(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    step_id = (await submit(client, run_id)).json()["step_id"]
    await wait_status(client, step_id, "succeeded")
    a = await client.post(f"/v1/runs/{run_id}/checkpoint", json={"state": {"pc": 1, "vars": {}}})
    b = await client.post(
        f"/v1/runs/{run_id}/checkpoint", json={"state": {"vars": {}, "pc": 1.0}, "step_id": step_id}
    )
    assert a.status_code == 201 and b.status_code == 201
    assert a.json()["state_hash"] == b.json()["state_hash"]  # same state, canonical hash
    assert b.json()["step_id"] == step_id
    listed = (await client.get(f"/v1/runs/{run_id}/checkpoints")).json()
    assert [c["checkpoint_id"] for c in listed] == [
        a.json()["checkpoint_id"],
        b.json()["checkpoint_id"],
    ]
    assert listed[0]["state"] == {"pc": 1, "vars": {}}
    bad = await client.post(f"/v1/runs/{run_id}/checkpoint", json={"state": [1]})
    assert bad.status_code == 422
    assert bad.json()["details"]["errors"][0]["field"] == "state"


async def test_pools(client: httpx.AsyncClient) -> None:
    pools = (await client.get("/v1/pools")).json()
    assert [p["pool_id"] for p in pools] == ["local"]
    pool = pools[0]
    assert pool["engine"] == "sim"
    assert pool["health"] == "ready"
    assert pool["capabilities"]["model_hash"].startswith("sha256:")
    assert pool["capabilities"]["engine"] == "sim"
    assert pool["load"] == {"slots_busy": 0, "slots_free": 8, "queue_depth": 0}
    assert pool["replicas"][0]["health"]["ready"] is True
    one = (await client.get("/v1/pools/local")).json()
    assert one["pool_id"] == "local"
    missing = await client.get("/v1/pools/none")
    assert missing.status_code == 404
