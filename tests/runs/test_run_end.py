"""Runs that end: complete, refusals after the end, run_end on the run stream, listing."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import (
    make_flow,
    make_run,
    read_run_stream,
    sleeping_step,
    submit,
    wait_status,
)


async def test_complete_ends_the_run_and_refuses_more_work(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, token="a", max_tokens=4)).json()["step_id"]
    await wait_status(live, step_id, "succeeded")
    r = await live.post(
        f"/v1/runs/{run_id}/complete", json={"status": "succeeded", "output": {"answer": 42}}
    )
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["status"] == "succeeded" and run["output"] == {"answer": 42}
    assert run["ended_at"] is not None
    again = await live.post(
        f"/v1/runs/{run_id}/complete", json={"status": "succeeded", "output": {"answer": 42}}
    )
    assert again.status_code == 200  # a retried completion answers the same
    other = await live.post(f"/v1/runs/{run_id}/complete", json={"status": "failed"})
    assert other.status_code == 409 and other.json()["code"] == "RUN_ENDED"
    late = await submit(live, run_id, token="late")
    assert late.status_code == 409 and late.json()["code"] == "RUN_ENDED"
    fact = await live.post(f"/v1/runs/{run_id}/facts", json={"type": "x", "data": {}})
    assert fact.status_code == 409 and fact.json()["code"] == "RUN_ENDED"
    events = await read_run_stream(live, run_id, 100)  # the stream closes after run_end
    assert [e.event for e in events][-1] == "run_end"
    assert events[-1].data == {
        "step_id": None,
        "seq": None,
        "type": "run_end",
        "run_id": run_id,
        "status": "succeeded",
    }
    resumed = await live.get(
        f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": events[-1].id or ""}
    )
    assert resumed.status_code == 200 and "event:" not in resumed.text


async def test_run_end_follows_the_last_step(live: httpx.AsyncClient) -> None:
    run_id, step_id = await sleeping_step(live)
    r = await live.post(f"/v1/runs/{run_id}/complete", json={"status": "failed"})
    assert r.json()["status"] == "failed" and r.json()["ended_at"] is None  # a step is live
    await live.post(f"/v1/steps/{step_id}/cancel")
    await wait_status(live, step_id, "cancelled")
    run = (await live.get(f"/v1/runs/{run_id}")).json()
    assert run["ended_at"] is not None
    kinds = [e.event for e in await read_run_stream(live, run_id, 10_000)]
    assert kinds[-2:] == ["end", "run_end"]


async def test_a_cancelled_run_ends_with_run_end(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    assert (await live.post(f"/v1/runs/{run_id}/cancel")).json()["status"] == "cancelled"
    events = await read_run_stream(live, run_id, 10)
    assert [e.event for e in events] == ["run_end"]
    assert events[0].data is not None and events[0].data["status"] == "cancelled"


@pytest.mark.parametrize(
    ("body", "field"),
    [({"status": "cancelled"}, "status"), ({}, "status"), ({"status": "failed", "x": 1}, "x")],
)
async def test_bad_complete_names_the_field(
    client: httpx.AsyncClient, body: dict[str, object], field: str
) -> None:
    run_id = await make_run(client)
    r = await client.post(f"/v1/runs/{run_id}/complete", json=body)
    assert r.status_code == 422
    assert field in [e["field"] for e in r.json()["details"]["errors"]]


async def test_list_runs_newest_first_with_filters_and_paging(client: httpx.AsyncClient) -> None:
    flow_a = await make_flow(client, {"a": 1})
    flow_b = await make_flow(client, {"b": 1})
    a_runs = [await make_run(client, flow_a) for _ in range(3)]
    b_run = await make_run(client, flow_b)
    await client.post(f"/v1/runs/{a_runs[0]}/complete", json={"status": "succeeded"})
    r = await client.get("/v1/runs", params={"flow_id": flow_a})
    assert [x["run_id"] for x in r.json()] == list(reversed(a_runs))
    page = await client.get("/v1/runs", params={"flow_id": flow_a, "limit": 2})
    assert [x["run_id"] for x in page.json()] == [a_runs[2], a_runs[1]]
    nxt = await client.get(
        "/v1/runs", params={"flow_id": flow_a, "limit": 2, "after": page.headers["X-Next-After"]}
    )
    assert [x["run_id"] for x in nxt.json()] == [a_runs[0]]
    done = await client.get("/v1/runs", params={"status": "succeeded"})
    assert [x["run_id"] for x in done.json()] == [a_runs[0]]
    everything = await client.get("/v1/runs")
    assert [x["run_id"] for x in everything.json()][:1] == [b_run]
    bad = await client.get("/v1/runs", params={"status": "sleeping"})
    assert bad.status_code == 422
    assert bad.json()["details"]["errors"][0]["field"] == "query.status"


async def test_facts_by_flow(client: httpx.AsyncClient) -> None:
    flow = await make_flow(client, {"f": 1})
    other = await make_flow(client, {"f": 2})
    r1, r2, r3 = (
        await make_run(client, flow),
        await make_run(client, flow),
        await make_run(client, other),
    )
    for run_id, kind in ((r1, "a"), (r2, "b"), (r1, "b"), (r3, "b")):
        assert (
            await client.post(
                f"/v1/runs/{run_id}/facts", json={"type": kind, "data": {"r": run_id}}
            )
        ).status_code == 201
    facts = (await client.get(f"/v1/flows/{flow}/facts")).json()
    assert [(f["run_id"], f["type"]) for f in facts] == [(r1, "a"), (r2, "b"), (r1, "b")]
    only_b = (await client.get(f"/v1/flows/{flow}/facts", params={"type": "b"})).json()
    assert [f["run_id"] for f in only_b] == [r2, r1]
    page = await client.get(f"/v1/flows/{flow}/facts", params={"limit": 2})
    rest = await client.get(
        f"/v1/flows/{flow}/facts", params={"after": page.headers["X-Next-After"]}
    )
    assert [f["fact_id"] for f in page.json() + rest.json()] == [f["fact_id"] for f in facts]
    assert (await client.get("/v1/flows/flow_nope/facts")).status_code == 404
    foreign = await client.get(
        f"/v1/flows/{flow}/facts", params={"after": facts[0]["fact_id"] + "x"}
    )
    assert foreign.status_code == 422
