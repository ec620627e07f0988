"""Seeds through HTTP, over a Salience pool (the reference runtime: its engine reports no
``seed`` feature) with more free slots and a sim pool (which takes seeds): a seeded run's
sampling steps go where a seed is taken, and are refused where none may be; a seeded run
pinned to the engine without seeds is refused at creation naming it; a strict_replay of a
step that sampled there is refused naming the engine, and one of greedy steps there replays
identically."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestratord.runtime import Orchestrator
from test_harness.salience_runtime import serve_salience
from tests.conftest import make_settings
from tests.helpers import make_flow, make_run, started_client, wait_status

POOLS = """
pools:
  - pool_id: sal
    engine: salience
    tags: {{kind: session}}
    price: {{free: true}}
    replicas:
      - {{replica_id: r0, url: '{url}', model: sim-1, slots: 8, options: {{tokenizer: sim}}}}
  - pool_id: sim
    engine: sim
    replicas: [{{replica_id: r0, slots: {sim_slots}}}]
"""


@contextlib.asynccontextmanager
async def serving(
    db_url: str, tmp_path: Path, *, sim_slots: int = 2, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_salience() as runtime:
        pools = tmp_path / "pools.yaml"
        pools.write_text(POOLS.format(url=runtime.address, sim_slots=sim_slots))
        orch = Orchestrator(make_settings(db_url, pools_file=pools, **settings))
        async with started_client(orch) as client:
            yield client


@pytest.fixture
async def client(db_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(db_url, tmp_path) as c:
        yield c


async def post_step(
    client: httpx.AsyncClient,
    run_id: str,
    token: str,
    temperature: float | None,
    placement: Any = "auto",
    max_tokens: int = 6,
) -> httpx.Response:
    params: dict[str, Any] = {"max_tokens": max_tokens}
    if temperature is not None:
        params["temperature"] = temperature
    body = {
        "type": "llm_call",
        "client_token": token,
        "input": {"prompt": f"say {token}", "params": params},
        "placement": placement,
    }
    return await client.post(f"/v1/runs/{run_id}/steps", json=body)


async def run_step(
    client: httpx.AsyncClient,
    run_id: str,
    token: str,
    temperature: float | None,
    placement: Any = "auto",
) -> dict[str, Any]:
    r = await post_step(client, run_id, token, temperature, placement)
    assert r.status_code == 202, r.text
    step = await wait_status(client, r.json()["step_id"], "succeeded", "failed")
    assert step["status"] == "succeeded", step.get("error")
    return step


async def test_a_seeded_run_s_sampling_steps_go_where_a_seed_is_taken(
    client: httpx.AsyncClient,
) -> None:
    unseeded = await make_run(client, seed=None)  # the server draws its seed
    assert (await run_step(client, unseeded, "u", 0.7))["pool_id"] == "sal"  # most free slots
    seeded = await make_run(client, seed=7)
    for token, temperature in (("a", 0.7), ("b", None)):  # omitted: the default samples
        step = await run_step(client, seeded, token, temperature)
        assert step["pool_id"] == "sim"
        reasons = {c["pool_id"]: c["reason"] for c in step["placement_decision"]["candidates"]}
        assert reasons == {"sal": "lacks seed", "sim": None}
    assert (await run_step(client, seeded, "greedy", 0.0))["pool_id"] == "sal"
    assert (await run_step(client, seeded, "pinned", 0.0, {"pin": "sal"}))["pool_id"] == "sal"
    # no pool that takes a seed may take it: refused naming the feature
    for token, placement in (("p", {"pin": "sal"}), ("q", {"affinity": {"kind": "session"}})):
        r = await post_step(client, seeded, token, 0.7, placement)
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["code"] == "INVALID_PARAMS"
        assert body["details"]["errors"][0]["field"] == "input.params.temperature"
        assert "no pool that may take this step offers seed (sal)" in body["message"]


async def test_a_seeded_run_pinned_to_an_engine_without_seeds_is_refused_naming_it(
    client: httpx.AsyncClient,
) -> None:
    flow_id = await make_flow(client)
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"seed": 7, "pool_policy": {"pin": "sal"}}
    )
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "INVALID_PARAMS"
    assert body["details"]["errors"][0]["field"] == "seed"
    assert body["details"]["engine"] == "salience" and body["details"]["pool_id"] == "sal"
    assert "pins pool 'sal' (engine salience), which has none" in body["message"]
    # without a seed, or pinned where seeds are taken, the run is made
    for run in ({"pool_policy": {"pin": "sal"}}, {"seed": 7, "pool_policy": {"pin": "sim"}}):
        r = await client.post(f"/v1/flows/{flow_id}/runs", json=run)
        assert r.status_code == 201, r.text


async def test_a_strict_replay_of_a_step_that_sampled_without_a_seed_is_refused_naming_it(
    client: httpx.AsyncClient,
) -> None:
    flow_id = await make_flow(client, {"seeds": 1})
    source = await make_run(client, flow_id, seed=None)
    await run_step(client, source, "greedy", 0.0, {"pin": "sal"})
    sampled = (await run_step(client, source, "sampled", 0.7, {"pin": "sal"}))["step_id"]
    await run_step(client, source, "seeded", 0.7, {"pin": "sim"})
    seed = (await client.get(f"/v1/runs/{source}")).json()["seed"]
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": source}
    )
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "STRICT_REPLAY_MISMATCH"
    said = (
        f"strict_replay needs a seeded engine: pool 'sal' (engine salience) has no seed, and"
        f" step {sampled} sampled (temperature 0.7)"
    )
    assert said in body["message"]
    assert body["details"]["mismatches"] == [
        {
            "input": "seed",
            "pool_id": "sal",
            "replica_id": "r0",
            "recorded": seed,
            "current": None,
            "engine": "salience",
            "step_id": sampled,
            "temperature": 0.7,
            "message": said,
        }
    ]
    # replay serves the record without an engine: not refused
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": source}
    )
    assert r.status_code == 201, r.text


async def test_a_strict_replay_of_greedy_steps_on_it_is_identical(
    client: httpx.AsyncClient,
) -> None:
    flow_id = await make_flow(client, {"seeds": 2})
    source = await make_run(client, flow_id, seed=11)
    steps = [("g0", 0.0), ("g1", 0.0), ("s", 0.7)]
    recorded = [await run_step(client, source, token, t) for token, t in steps]
    assert [s["pool_id"] for s in recorded] == ["sal", "sal", "sim"]
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": source}
    )
    assert r.status_code == 201, r.text
    replay = r.json()["run_id"]
    for (token, temperature), original in zip(steps, recorded, strict=True):
        step = await run_step(client, replay, token, temperature)
        assert step["replay_outcome"] == "identical", step
        assert (step["pool_id"], step["replica_id"]) == (original["pool_id"], "r0")
        assert step["output"] == original["output"]
    report = (await client.get(f"/v1/runs/{replay}/replay-report")).json()
    assert report["diverged"] is False and report["counts"]["identical"] == 3


async def test_a_moved_step_of_a_seeded_run_goes_only_where_a_seed_is_taken(
    db_url: str, tmp_path: Path
) -> None:
    """Failover places a queued step again by the same rules: when sim takes no steps, a
    seeded run's greedy step queued there moves to Salience, its sampling step waits."""
    async with serving(db_url, tmp_path, sim_slots=1, sim={"tokens_per_s": 2.0}) as client:
        run_id = await make_run(client, seed=7)
        r = await post_step(client, run_id, "blocker", 0.7, max_tokens=400)  # sim's one slot
        assert r.status_code == 202, r.text
        assert (await client.post("/v1/pools/sal/replicas/r0/drain")).status_code == 200
        queued = {}
        for token, temperature in (("greedy", 0.0), ("sampling", 0.7)):
            r = await post_step(client, run_id, token, temperature)
            assert r.status_code == 202, r.text
            queued[token] = r.json()["step_id"]
            step = (await client.get(f"/v1/steps/{queued[token]}")).json()
            assert (step["status"], step["pool_id"]) == ("queued", "sim")
        await client.post("/v1/pools/sal/replicas/r0/undrain")
        await client.post("/v1/pools/sim/replicas/r0/drain")  # sim takes no steps: its queue
        moved = await wait_status(client, queued["greedy"], "succeeded")
        assert moved["pool_id"] == "sal" and moved["placement_decision"]["moved_from"] == "sim"
        waiting = (await client.get(f"/v1/steps/{queued['sampling']}")).json()
        assert (waiting["status"], waiting["pool_id"]) == ("queued", "sim")
        await client.post(f"/v1/runs/{run_id}/cancel")
