"""``GET /metrics``: every documented name is exposed (and only those), and they move."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from tests.conftest import make_settings
from tests.helpers import StreamsWatch, make_run, submit, wait_status


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url, sim={"slots": 1, "tokens_per_s": 40.0})


DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented() -> set[str]:
    return set(re.findall(r"^\| `(orchestratord_[a-z_]+)`", DOC.read_text(), re.MULTILINE))


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_every_documented_name_is_exposed_and_only_those(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    await wait_status(client, (await submit(client, run_id)).json()["step_id"], "succeeded")
    r = await client.get("/metrics")
    exposed = {f.name for f in text_string_to_metric_families(r.text)}
    exposed = {f"{n}_total" if f"{n}_total" in documented() else n for n in exposed}
    exposed = {n for n in exposed if n.startswith("orchestratord_")}
    assert exposed == documented()


async def test_metrics_move_with_the_work(client: httpx.AsyncClient) -> None:
    before = await scrape(client)
    run_id = await make_run(client, budgets={"max_tokens_out": 20})
    step = await wait_status(
        client, (await submit(client, run_id, max_tokens=20)).json()["step_id"], "succeeded"
    )
    refused = await submit(client, run_id, token="more", max_tokens=5)  # the budget is spent
    assert refused.status_code == 409 and refused.json()["code"] == "BUDGET_EXCEEDED"
    after = await scrape(client)
    pool = step["pool_id"]
    steps = "orchestratord_steps_total"
    assert (
        value(after, steps, kind="llm_call", status="succeeded")
        == value(before, steps, kind="llm_call", status="succeeded") + 1
    )
    out = "orchestratord_tokens_total"
    assert (
        value(after, out, pool=pool, direction="out")
        - value(before, out, pool=pool, direction="out")
        == step["usage"]["tokens_out"]
    )
    ttft = "orchestratord_time_to_first_token_seconds_count"
    assert value(after, ttft, pool=pool) == value(before, ttft, pool=pool) + 1
    placed = "orchestratord_placements_total"
    assert value(after, placed, pool=pool, replica=step["replica_id"]) >= 1
    commits = "orchestratord_event_writer_commit_seconds_count"
    assert value(after, commits) > value(before, commits)
    allowed = "orchestratord_policy_decisions_total"
    assert value(after, allowed, decision="allowed") > value(before, allowed, decision="allowed")
    refusals, code = "orchestratord_refusals_total", "BUDGET_EXCEEDED"
    assert value(after, refusals, code=code) == value(before, refusals, code=code) + 1
    assert value(after, "orchestratord_replica_ready", pool=pool, replica=step["replica_id"]) == 1


async def test_queue_depth_and_subscribers_are_read_when_scraped(
    live: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = StreamsWatch(orch, monkeypatch)
    client = live
    run_id = await make_run(client)
    running = (await submit(client, run_id, token="a", max_tokens=400)).json()["step_id"]
    await wait_status(client, running, "running")
    queued = (await submit(client, run_id, token="b", max_tokens=5)).json()["step_id"]
    samples = await scrape(client)  # the one slot is taken: b waits
    assert value(samples, "orchestratord_queue_depth", pool="local", priority="interactive") == 1
    assert value(samples, "orchestratord_replica_busy_slots", pool="local", replica="r0") == 1

    async def follow() -> None:
        async with client.stream("GET", f"/v1/steps/{running}/stream") as stream:
            async for _ in stream.aiter_bytes():
                pass  # read to the end: a client that stops reading has left

    follower = asyncio.create_task(follow())
    await streams.until(lambda: orch.hub.subscribers().get("step") == 1)
    samples = await scrape(client)
    assert value(samples, "orchestratord_sse_subscribers", stream="step") == 1
    for step_id in (queued, running):
        await client.post(f"/v1/steps/{step_id}/cancel")
        await wait_status(client, step_id, "cancelled")
    await asyncio.wait_for(follower, 10)  # the stream ended with its step
    samples = await scrape(client)
    assert value(samples, "orchestratord_queue_depth", pool="local", priority="interactive") == 0
    assert value(samples, "orchestratord_sse_subscribers", stream="step") == 0
