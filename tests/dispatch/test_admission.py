"""Admission: bounded queues per priority, reject or drop-lru, FIFO within a priority."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import make_run, read_stream, started_client, wait_status


async def _client(db_url: str, **admission: Any) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        db_url,
        sim={"tokens_per_s": 100.0, "slots": 1},
        admission={"interactive_capacity": 2, "batch_capacity": 2, **admission},
    )
    orch = Orchestrator(settings)
    async with started_client(orch, "http://t") as c:
        yield c


@pytest.fixture
async def rejecting(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(db_url, on_full="reject", retry_after_s=3):
        yield c


@pytest.fixture
async def dropping(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(db_url, on_full="drop-lru"):
        yield c


async def step(
    c: httpx.AsyncClient,
    run_id: str,
    token: str,
    *,
    priority: str = "interactive",
    max_tokens: int = 5,
) -> httpx.Response:
    return await c.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": token,
            "priority": priority,
            "input": {"prompt": "x", "params": {"max_tokens": max_tokens}},
        },
    )


async def test_full_queue_rejects_with_retry_after(rejecting: httpx.AsyncClient) -> None:
    c = rejecting
    run_id = await make_run(c)
    busy = (await step(c, run_id, "busy", max_tokens=300)).json()["step_id"]
    await wait_status(c, busy, "running")
    for t in ("q1", "q2"):
        assert (await step(c, run_id, t)).status_code == 202
    r = await step(c, run_id, "q3")
    assert r.status_code == 429
    assert r.headers["Retry-After"] == "3"
    body = r.json()
    assert body["code"] == "ADMISSION_REJECT" and body["retriable"] is True
    assert body["retry_after_ms"] == 3000
    assert body["details"] == {"priority": "interactive", "queued": 2, "capacity": 2}
    run = (await c.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 3  # the refused step was not stored
    # the batch queue is separate
    assert (await step(c, run_id, "b1", priority="batch")).status_code == 202
    await c.post(f"/v1/runs/{run_id}/cancel")


async def test_cancelled_queued_step_leaves_the_queue(rejecting: httpx.AsyncClient) -> None:
    c = rejecting
    run_id = await make_run(c)
    busy = (await step(c, run_id, "busy", max_tokens=300)).json()["step_id"]
    await wait_status(c, busy, "running")
    q1 = (await step(c, run_id, "q1")).json()["step_id"]
    assert (await step(c, run_id, "q2")).status_code == 202
    assert (await step(c, run_id, "q3")).status_code == 429
    await c.post(f"/v1/steps/{q1}/cancel")
    assert (await step(c, run_id, "q3")).status_code == 202
    await c.post(f"/v1/runs/{run_id}/cancel")


async def test_drop_lru_drops_the_oldest_queued_step(dropping: httpx.AsyncClient) -> None:
    c = dropping
    run_id = await make_run(c, budgets={"max_tokens_out": 10000})
    busy = (await step(c, run_id, "busy", max_tokens=300)).json()["step_id"]
    await wait_status(c, busy, "running")
    oldest = (await step(c, run_id, "q1")).json()["step_id"]
    second = (await step(c, run_id, "q2")).json()["step_id"]
    newest = await step(c, run_id, "q3")
    assert newest.status_code == 202
    dropped = (await c.get(f"/v1/steps/{oldest}")).json()
    assert dropped["status"] == "failed"
    assert dropped["error"]["code"] == "QUEUE_FULL_DROP_LRU"
    assert dropped["error"]["retriable"] is True
    events = await read_stream(c, f"/v1/steps/{oldest}/stream")
    assert [e.event for e in events] == ["started", "error"]
    assert (await c.get(f"/v1/steps/{second}")).json()["status"] == "queued"
    run = (await c.get(f"/v1/runs/{run_id}")).json()
    assert run["reserved"]["tokens_out"] == 300 + 5 + 5  # the dropped step's hold went back
    await c.post(f"/v1/runs/{run_id}/cancel")


async def test_interactive_first_then_fifo(rejecting: httpx.AsyncClient) -> None:
    c = rejecting
    run_id = await make_run(c)
    busy = (await step(c, run_id, "busy", max_tokens=50)).json()["step_id"]
    await wait_status(c, busy, "running")
    order = [
        ("b1", "batch"),
        ("i1", "interactive"),
        ("b2", "batch"),
        ("i2", "interactive"),
    ]
    ids = {t: (await step(c, run_id, t, priority=p)).json()["step_id"] for t, p in order}
    started = {}
    for t, sid in ids.items():
        started[t] = (await wait_status(c, sid, "succeeded"))["started_at"]
    assert sorted(started, key=lambda t: started[t]) == ["i1", "i2", "b1", "b2"]


async def test_a_step_that_starts_at_once_is_not_refused_by_a_full_queue(
    db_url: str, tmp_path: Path
) -> None:
    """The queue bounds steps that wait: a step whose pool has a free slot does not wait,
    even while another pool's backlog fills its priority's queue."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n"
        "  - {pool_id: busy, engine: sim, replicas: [{replica_id: r1, slots: 1}]}\n"
        "  - {pool_id: idle, engine: sim, replicas: [{replica_id: r1, slots: 1}]}\n"
    )
    settings = make_settings(
        db_url,
        pools_file=pools,
        sim={"tokens_per_s": 100.0},
        admission={"interactive_capacity": 1, "on_full": "reject"},
    )
    orch = Orchestrator(settings)
    await orch.start()
    try:
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            run_id = await make_run(c)

            async def on(pool: str, token: str) -> httpx.Response:
                return await c.post(
                    f"/v1/runs/{run_id}/steps",
                    json={
                        "type": "llm_call",
                        "client_token": token,
                        "placement": {"pin": pool},
                        "input": {"prompt": "x", "params": {"max_tokens": 300}},
                    },
                )

            assert (await on("busy", "running")).json()["status"] == "running"
            assert (await on("busy", "waits")).json()["status"] == "queued"
            refused = await on("busy", "refused")
            assert refused.status_code == 429, refused.text
            assert refused.json()["details"]["queued"] == 1
            started = await on("idle", "starts")
            assert started.status_code == 202, started.text
            assert started.json()["status"] == "running"
            # the slot taken, the next step for that pool waits and finds the queue full
            assert (await on("idle", "after")).status_code == 429
    finally:
        await orch.stop()
