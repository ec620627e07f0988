"""Writes an interpreter retries: a fact, a checkpoint and a run posted 20 times at once with
one ``client_token`` are stored once (one 201, the others 200 with the same record); the same
token with another body is 409 naming ``client_token``; without a token each post stores."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import make_flow, make_run, read_stream, started_client

Post = Callable[[dict[str, Any]], Awaitable[httpx.Response]]


async def _twenty_at_once(post: Post, body: dict[str, Any], key: str) -> str:
    answers = await asyncio.gather(*(post(body) for _ in range(20)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 19 + [201], [r.text for r in answers if r.status_code >= 300]
    ids = {r.json()[key] for r in answers}
    assert len(ids) == 1
    return str(ids.pop())


async def _refused_with_another_body(post: Post, body: dict[str, Any]) -> None:
    r = await post(body)
    assert r.status_code == 409, r.text
    assert r.json()["details"]["field"] == "client_token"


async def test_a_retried_fact_is_stored_once(db_url: str) -> None:
    async with started_client(Orchestrator(make_settings(db_url))) as client:
        run_id = await make_run(client)

        async def post(body: dict[str, Any]) -> httpx.Response:
            return await client.post(f"/v1/runs/{run_id}/facts", json=body)

        body = {"type": "obs", "data": {"x": 1}, "client_token": "f1"}
        fact_id = await _twenty_at_once(post, body, "fact_id")
        await _refused_with_another_body(post, {**body, "data": {"x": 2}})
        facts = (await client.get(f"/v1/runs/{run_id}/facts")).json()
        assert [f["fact_id"] for f in facts] == [fact_id]
        await client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
        events = await read_stream(client, f"/v1/runs/{run_id}/stream")
        assert [e.event for e in events].count("fact") == 1  # its event once too
        untokened = {"type": "obs", "data": {"x": 1}}
        run2 = await make_run(client)
        for _ in range(2):
            r = await client.post(f"/v1/runs/{run2}/facts", json=untokened)
            assert r.status_code == 201
        assert len((await client.get(f"/v1/runs/{run2}/facts")).json()) == 2


async def test_a_retried_checkpoint_is_stored_once(db_url: str) -> None:
    async with started_client(Orchestrator(make_settings(db_url))) as client:
        run_id = await make_run(client)

        async def post(body: dict[str, Any]) -> httpx.Response:
            return await client.post(f"/v1/runs/{run_id}/checkpoint", json=body)

        body = {"state": {"turn": 3}, "client_token": "c1"}
        checkpoint_id = await _twenty_at_once(post, body, "checkpoint_id")
        await _refused_with_another_body(post, {**body, "state": {"turn": 4}})
        stored = (await client.get(f"/v1/runs/{run_id}/checkpoints")).json()
        assert [c["checkpoint_id"] for c in stored] == [checkpoint_id]


async def test_a_retried_run_is_created_once(db_url: str) -> None:
    async with started_client(Orchestrator(make_settings(db_url))) as client:
        flow_id = await make_flow(client, {"tokens": 1})

        async def post(body: dict[str, Any]) -> httpx.Response:
            return await client.post(f"/v1/flows/{flow_id}/runs", json=body)

        body = {"seed": 5, "client_token": "r1"}
        run_id = await _twenty_at_once(post, body, "run_id")
        await _refused_with_another_body(post, {**body, "seed": 6})
        runs = (await client.get("/v1/runs", params={"flow_id": flow_id})).json()
        assert [r["run_id"] for r in runs] == [run_id]
        # the token is the flow's: another flow may use it
        other = await make_flow(client, {"tokens": 2})
        r = await client.post(f"/v1/flows/{other}/runs", json=body)
        assert r.status_code == 201 and r.json()["run_id"] != run_id


async def test_a_retried_fork_is_made_once(db_url: str) -> None:
    async with started_client(Orchestrator(make_settings(db_url))) as client:
        flow_id = await make_flow(client, {"tokens": 3})
        parent = await make_run(client, flow_id)
        checkpoint = await client.post(f"/v1/runs/{parent}/checkpoint", json={"state": {"n": 1}})
        checkpoint_id = checkpoint.json()["checkpoint_id"]

        async def post(body: dict[str, Any]) -> httpx.Response:
            return await client.post(f"/v1/runs/{parent}/fork", json=body)

        body = {"checkpoint_id": checkpoint_id, "client_token": "fork-1"}
        fork_id = await _twenty_at_once(post, body, "run_id")
        other = await client.post(f"/v1/runs/{parent}/checkpoint", json={"state": {"n": 2}})
        await _refused_with_another_body(
            post, {**body, "checkpoint_id": other.json()["checkpoint_id"]}
        )
        runs = (await client.get("/v1/runs", params={"flow_id": flow_id})).json()
        assert sorted(r["run_id"] for r in runs) == sorted([parent, fork_id])
        assert (await client.get(f"/v1/runs/{fork_id}")).json()["forked_from"] == {
            "run_id": parent,
            "checkpoint_id": checkpoint_id,
        }
