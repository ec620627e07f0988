"""checkpoint steps: state with the server's cursors, an event before end, replay."""

from __future__ import annotations

import httpx

from tests.helpers import make_flow, make_run, read_run_stream, read_stream, submit, wait_status


async def checkpoint(
    client: httpx.AsyncClient, run_id: str, state: object, token: str = "c"
) -> dict:  # type: ignore[type-arg]
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "checkpoint", "client_token": token, "input": {"state": state}},
    )
    assert r.status_code == 202, r.text
    return await wait_status(client, r.json()["step_id"], "succeeded", "failed")


async def test_a_checkpoint_step_stores_state_and_cursors(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    llm = (await submit(client, run_id, token="a", max_tokens=3)).json()["step_id"]
    await wait_status(client, llm, "succeeded")
    fact = (await client.post(f"/v1/runs/{run_id}/facts", json={"type": "n", "data": 1})).json()
    step = await checkpoint(client, run_id, {"pc": 7, "vars": {"x": [1, 2]}})
    assert step["status"] == "succeeded"
    out = step["output"]
    assert out["state_hash"].startswith("sha256:")
    events = await read_stream(client, f"/v1/steps/{step['step_id']}/stream")
    assert [e.event for e in events] == ["started", "checkpoint", "end"]
    assert events[1].data is not None and events[1].data["checkpoint_id"] == out["checkpoint_id"]
    cps = (await client.get(f"/v1/runs/{run_id}/checkpoints")).json()
    assert [c["checkpoint_id"] for c in cps] == [out["checkpoint_id"]]
    cp = cps[0]
    assert cp["state"] == {"pc": 7, "vars": {"x": [1, 2]}} and cp["step_id"] == step["step_id"]
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert cp["cursors"] == {
        "last_fact_id": fact["fact_id"],
        "last_step_position": 1,
        "usage": run["usage"],
    }


async def test_bad_state_names_the_field(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "checkpoint", "client_token": "x", "input": {"state": [1]}},
    )
    assert r.status_code == 422
    assert "input.state" in [e["field"] for e in r.json()["details"]["errors"]]


async def test_replay_serves_a_recorded_checkpoint(client: httpx.AsyncClient) -> None:
    flow_id = await make_flow(client)
    source = await make_run(client, flow_id)
    recorded = await checkpoint(client, source, {"k": 1})
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": source}
    )
    replay = r.json()["run_id"]
    served = await checkpoint(client, replay, {"k": 1})
    assert served["replay_outcome"] == "identical"
    assert served["output"] == recorded["output"]
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": source}
    )
    missed = await checkpoint(client, r.json()["run_id"], {"k": 2})
    assert missed["error"]["code"] == "REPLAY_MISS"


async def test_a_fork_starts_from_a_checkpoint(live: httpx.AsyncClient) -> None:
    client = live
    run_id = await make_run(client, seed=5, budgets={"max_tokens_out": 500})
    for n in (1, 2):
        await client.post(f"/v1/runs/{run_id}/facts", json={"type": "n", "data": n})
    cp = await checkpoint(client, run_id, {"pc": 2})
    await client.post(f"/v1/runs/{run_id}/facts", json={"type": "n", "data": 3})  # after it
    r = await client.post(
        f"/v1/runs/{run_id}/fork", json={"checkpoint_id": cp["output"]["checkpoint_id"]}
    )
    assert r.status_code == 201, r.text
    fork = r.json()
    assert fork["forked_from"] == {"run_id": run_id, "checkpoint_id": cp["output"]["checkpoint_id"]}
    assert fork["mode"] == "record" and fork["seed"] == 5 and fork["status"] == "running"
    assert fork["budgets"]["max_tokens_out"] == 500 and fork["step_count"] == 0
    facts = (await client.get(f"/v1/runs/{fork['run_id']}/facts")).json()
    assert [f["data"] for f in facts] == [1, 2]
    cps = (await client.get(f"/v1/runs/{fork['run_id']}/checkpoints")).json()
    assert [c["state"] for c in cps] == [{"pc": 2}]
    assert cps[0]["cursors"]["last_fact_id"] == facts[-1]["fact_id"]
    step = await wait_status(
        client,
        (await submit(client, fork["run_id"], token="s", max_tokens=3)).json()["step_id"],
        "succeeded",
    )
    assert step["position"] == 0
    parent = (await client.get(f"/v1/runs/{run_id}/facts")).json()
    assert [f["data"] for f in parent] == [1, 2, 3]  # untouched
    assert (await client.get(f"/v1/runs/{run_id}")).json()["step_count"] == 1
    events = await read_run_stream(client, fork["run_id"], 2)
    assert [(e.event, e.data["data"]) for e in events[:2] if e.data] == [("fact", 1), ("fact", 2)]


async def test_a_fork_needs_a_checkpoint_of_its_run(client: httpx.AsyncClient) -> None:
    a, b = await make_run(client), await make_run(client)
    cp = await checkpoint(client, b, {"x": 1})
    for body in ({"checkpoint_id": cp["output"]["checkpoint_id"]}, {"checkpoint_id": "ckpt_x"}):
        r = await client.post(f"/v1/runs/{a}/fork", json=body)
        assert r.status_code == 422
        assert r.json()["details"]["errors"][0]["field"] == "checkpoint_id"
    assert (
        await client.post("/v1/runs/run_nope/fork", json={"checkpoint_id": "c"})
    ).status_code == 404
