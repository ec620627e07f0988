"""Placement through HTTP, over three sim pools from a pools file: selectors, the decision
stored on the step (and in its export), its narration on the stream, a replica whose
breaker is open left out, and a strict_replay of a run placed by selectors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import make_flow, make_run, read_stream, started_client, wait_status

POOLS = """
pools:
  - pool_id: eu
    engine: sim
    tags: {region: eu}
    gpu: {arch: sm80, vram_gib: 40}
    replicas: [{replica_id: r0, slots: 2}]
  - pool_id: us
    engine: sim
    tags: {region: us}
    gpu: {arch: sm90, vram_gib: 80}
    replicas: [{replica_id: r0, slots: 2}, {replica_id: r1, slots: 2}]
  - pool_id: cpu
    engine: sim
    tags: {region: ap}
    replicas: [{replica_id: r0, slots: 8}]
"""


@pytest.fixture
async def fleet(
    db_url: str, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, Orchestrator]]:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    orch = Orchestrator(make_settings(db_url, pools_file=pools))
    async with started_client(orch) as client:
        yield client, orch


async def step_on(client: httpx.AsyncClient, run_id: str, token: str, placement: Any) -> str:
    body = {
        "type": "llm_call",
        "client_token": token,
        "input": {"prompt": f"say {token}", "params": {"max_tokens": 4}},
        "placement": placement,
    }
    r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["step_id"])


SELECTOR = {"affinity": {"in": {"region": ["eu", "us"]}, "min_vram_gib": 48}}


async def test_a_selector_places_the_step_and_the_decision_says_why(
    fleet: tuple[httpx.AsyncClient, Orchestrator],
) -> None:
    client, _ = fleet
    run_id = await make_run(client)
    step_id = await step_on(client, run_id, "a", SELECTOR)
    step = await wait_status(client, step_id, "succeeded")
    assert (step["pool_id"], step["replica_id"]) == ("us", "r0")
    decision = step["placement_decision"]
    assert decision["rule"] == "affinity"
    assert decision["chosen"] == {"pool_id": "us", "replica_id": "r0"}
    reasons = {(c["pool_id"], c["replica_id"]): c["reason"] for c in decision["candidates"]}
    assert reasons == {
        ("cpu", "r0"): "region='ap' not in ['eu', 'us']",
        ("eu", "r0"): "vram 40 GiB < 48 GiB",
        ("us", "r0"): None,
        ("us", "r1"): None,
    }
    events = await read_stream(client, f"/v1/steps/{step_id}/stream")
    assert [e.event for e in events[:2]] == ["started", "narration"]
    assert events[1].data is not None
    assert events[1].data["text"] == "placed on us/r0: 4 candidates; chosen by affinity"
    bundle = (await client.get(f"/v1/runs/{run_id}/export")).json()
    (exported,) = [s for s in bundle["steps"] if s["step_id"] == step_id]
    assert decision.pop("moved_from") is None  # (not moved: the stored decision has none)
    assert exported["placement_decision"] == decision


async def test_a_replica_whose_breaker_is_open_takes_no_steps(
    fleet: tuple[httpx.AsyncClient, Orchestrator],
) -> None:
    client, orch = fleet
    breakers = orch.services.engine_breakers
    for replica in ("r0", "r1"):  # every replica of us: calls to it fail fast
        breaker = breakers.get(orch.pools.require("us").breaker_target(replica))
        while not breakers.is_open(breaker.target):
            breaker.before_call().failure("engine down")
    run_id = await make_run(client)
    selector = {"affinity": {"in": {"region": ["eu", "us"]}}}
    step = await wait_status(client, await step_on(client, run_id, "b", selector), "succeeded")
    assert step["pool_id"] == "eu"
    decision = step["placement_decision"]
    states = {(c["pool_id"], c["replica_id"]): c["reason"] for c in decision["candidates"]}
    assert states[("us", "r0")] == states[("us", "r1")] == "breaker_open"
    pools = {p["pool_id"]: p for p in (await client.get("/v1/pools")).json()}
    assert [r["free"] for r in pools["us"]["replicas"]] == [0, 0]
    assert [r["breaker"]["state"] for r in pools["us"]["replicas"]] == ["open", "open"]
    assert all(r["breaker"]["failures"] > 0 for r in pools["us"]["replicas"])
    assert pools["eu"]["replicas"][0]["breaker"] == {"state": "closed", "failures": 0}
    # pinned to it, a step waits in its queue (a pin is honoured) instead of failing fast
    pinned = await step_on(client, run_id, "c", {"pin": "us"})
    assert (await client.get(f"/v1/steps/{pinned}")).json()["status"] == "queued"


async def test_a_strict_replay_of_a_run_placed_by_selectors_is_identical(
    fleet: tuple[httpx.AsyncClient, Orchestrator],
) -> None:
    client, _ = fleet
    flow_id = await make_flow(client)
    source = await make_run(client, flow_id, seed=5)
    placements = [SELECTOR, {"affinity": {"not_in": {"region": ["us"]}}}, "auto"]
    recorded = [await step_on(client, source, f"s{i}", p) for i, p in enumerate(placements)]
    for step_id in recorded:
        await wait_status(client, step_id, "succeeded")
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": source}
    )
    assert r.status_code == 201, r.text
    replay = r.json()["run_id"]
    for i, placement in enumerate(placements):
        step = await wait_status(
            client, await step_on(client, replay, f"s{i}", placement), "succeeded", "failed"
        )
        assert step["replay_outcome"] == "identical", step
        original = (await client.get(f"/v1/steps/{recorded[i]}")).json()
        assert (step["pool_id"], step["replica_id"]) == (
            original["pool_id"],
            original["replica_id"],
        )
        assert step["output"] == original["output"]
        assert step["placement_decision"]["rule"] == "replay"
    report = (await client.get(f"/v1/runs/{replay}/replay-report")).json()
    assert report["diverged"] is False and report["counts"]["identical"] == 3, report


def _counted(text: str, name: str) -> dict[str, float]:
    """A counter's series from a /metrics text: labels as written -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            out[labels] = float(value)
    return out


async def test_placements_are_counted_by_rule_outcome_and_cause(
    fleet: tuple[httpx.AsyncClient, Orchestrator],
) -> None:
    client, _ = fleet
    run_id = await make_run(client)
    await wait_status(client, await step_on(client, run_id, "m", SELECTOR), "succeeded")
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "none",
            "input": {"prompt": "x"},
            "placement": {"affinity": {"min_vram_gib": 500}},
        },
    )
    assert r.status_code == 422
    text = (await client.get("/metrics")).text
    decisions = _counted(text, "orchestratord_placement_decisions_total")
    assert decisions['{outcome="placed",rule="affinity"}'] == 1
    assert decisions['{outcome="refused",rule="affinity"}'] == 1
    passed_over = _counted(text, "orchestratord_placement_passed_over_total")
    assert passed_over == {'{cause="placement"}': 2.0}  # cpu (region), eu (vram)
