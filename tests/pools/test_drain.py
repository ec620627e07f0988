"""Draining a replica through HTTP (admin): it takes no new step, its running ones finish,
the pools show it, and the drain outlives a restart; undrained, it takes steps again."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from orchestratord.runtime import Orchestrator
from test_harness.fake_openai import FakeState, Faults, create_fake_openai
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import make_run, read_stream, started_client, submit, wait_status

POOLS = """
pools:
  - pool_id: gpu
    engine: sim
    replicas: [{replica_id: a, slots: 4}, {replica_id: b, slots: 1}]
"""


def _orch(db_url: str, tmp_path: Path, **kw: object) -> Orchestrator:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    return Orchestrator(make_settings(db_url, pools_file=pools, **kw))


def _states(pool: dict[str, Any]) -> dict[str, str]:
    return {r["replica_id"]: r["state"] for r in pool["replicas"]}


async def test_a_drained_replica_takes_no_new_step_until_undrained(
    db_url: str, tmp_path: Path
) -> None:
    async with started_client(_orch(db_url, tmp_path)) as client:
        r = await client.post("/v1/pools/gpu/replicas/a/drain")
        assert r.status_code == 200, r.text
        assert _states(r.json()) == {"a": "draining", "b": "ready"}
        run_id = await make_run(client)
        steps = [(await submit(client, run_id, token=f"t{i}")).json()["step_id"] for i in range(4)]
        ended = [await wait_status(client, s, "succeeded") for s in steps]
        assert {s["replica_id"] for s in ended} == {"b"}  # one slot at a time: never a
        decision = ended[0]["placement_decision"]
        assert {c["replica_id"]: c["reason"] for c in decision["candidates"]} == {
            "a": "draining",
            "b": None,
        }
    async with started_client(_orch(db_url, tmp_path)) as client:  # a restart keeps it
        pool = (await client.get("/v1/pools/gpu")).json()
        assert _states(pool) == {"a": "draining", "b": "ready"}
        r = await client.post("/v1/pools/gpu/replicas/a/undrain")
        assert _states(r.json()) == {"a": "ready", "b": "ready"}
        run_id = await make_run(client)
        step_id = (await submit(client, run_id)).json()["step_id"]
        assert (await wait_status(client, step_id, "succeeded"))["replica_id"] == "a"


async def test_draining_names_what_is_unknown(db_url: str, tmp_path: Path) -> None:
    """(Its admin scope is tested with every route's, tests/auth/test_auth.py.)"""
    async with started_client(_orch(db_url, tmp_path)) as client:
        r = await client.post("/v1/pools/nope/replicas/a/drain")
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND"
        r = await client.post("/v1/pools/gpu/replicas/zz/drain")
        assert r.status_code == 404 and "gpu/zz" in r.json()["message"]
        pool = (await client.get("/v1/pools/gpu")).json()
        assert _states(pool) == {"a": "ready", "b": "ready"}  # nothing drained


TWO_POOLS = """
pools:
  - {pool_id: a, engine: sim, tags: {region: eu}, replicas: [{replica_id: r0, slots: 1}]}
  - {pool_id: b, engine: sim, tags: {region: eu}, replicas: [{replica_id: r0, slots: 1}]}
"""


async def test_steps_queued_on_a_pool_that_takes_no_steps_move_unless_pinned(
    db_url: str, tmp_path: Path
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(TWO_POOLS)
    orch = Orchestrator(make_settings(db_url, pools_file=pools, sim={"tokens_per_s": 40.0}))
    async with started_client(orch) as client:
        assert (await client.post("/v1/pools/b/replicas/r0/drain")).status_code == 200
        run_id = await make_run(client)

        async def step(token: str, placement: Any) -> str:
            body = {
                "type": "llm_call",
                "client_token": token,
                "input": {"prompt": token, "params": {"max_tokens": 20}},
                "placement": placement,
            }
            r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
            assert r.status_code == 202, r.text
            return str(r.json()["step_id"])

        running = await step("s0", "auto")  # a's one slot
        moving = [await step("s1", {"affinity": {"region": "eu"}}), await step("s2", "auto")]
        pinned = await step("s3", {"pin": "a"})
        for step_id in [*moving, pinned]:
            queued = (await client.get(f"/v1/steps/{step_id}")).json()
            assert (queued["status"], queued["pool_id"]) == ("queued", "a")

        await client.post("/v1/pools/b/replicas/r0/undrain")
        await client.post("/v1/pools/a/replicas/r0/drain")  # a takes no steps: its queue moves
        for step_id in moving:
            ended = await wait_status(client, step_id, "succeeded")
            assert (ended["pool_id"], ended["replica_id"]) == ("b", "r0")
            assert ended["placement_decision"]["moved_from"] == "a"
            events = await read_stream(client, f"/v1/steps/{step_id}/stream")
            told = [e.data["text"] for e in events if e.event == "narration" and e.data]
            assert told[0].startswith("placed on b/r0: 2 candidates; chosen by ")
            assert told[0].endswith("(moved from a: its replicas took no steps)")
        assert (await wait_status(client, running, "succeeded"))["pool_id"] == "a"  # it ran on
        assert (await client.get(f"/v1/steps/{pinned}")).json()["status"] == "queued"
        await client.post("/v1/pools/a/replicas/r0/undrain")
        ended = await wait_status(client, pinned, "succeeded")
        assert (ended["pool_id"], ended["placement_decision"]["moved_from"]) == ("a", None)


async def test_a_killed_engine_s_queued_steps_finish_on_another_pool(
    db_url: str, tmp_path: Path
) -> None:
    """Pool a's engine goes away mid-run: once the health refresh finds a down, the steps
    queued there finish on pool b."""
    fakes = [FakeState(faults=Faults(token_delay_s=0.02)), FakeState()]
    engine_a, engine_b = contextlib.AsyncExitStack(), contextlib.AsyncExitStack()
    urls = [
        await stack.enter_async_context(serve_app(create_fake_openai(fake)))
        for stack, fake in zip((engine_a, engine_b), fakes, strict=True)
    ]
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n"
        + "".join(
            f"  - {{pool_id: {name}, engine: openai, replicas: [{{replica_id: r0,"
            f" url: '{url}/v1', model: fake-model, slots: 1}}]}}\n"
            for name, url in zip("ab", urls, strict=True)
        )
    )
    prices = tmp_path / "prices"
    prices.mkdir()
    (prices / "2026-01-01.yaml").write_text(
        'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        "  - {engine: openai, model: fake-model, free: true}\n"
    )
    settings = make_settings(
        db_url, pools_file=pools, price_tables_dir=prices, health_interval_s=0.2
    )
    try:
        async with started_client(Orchestrator(settings)) as client:
            await client.post("/v1/pools/b/replicas/r0/drain")  # a takes them all, for now
            run_id = await make_run(client)
            steps = [
                (await submit(client, run_id, token=f"k{i}", max_tokens=200)).json()["step_id"]
                for i in range(3)
            ]
            running, *queued = steps
            await wait_status(client, running, "running")
            for step_id in queued:
                assert (await client.get(f"/v1/steps/{step_id}")).json()["pool_id"] == "a"
            await client.post("/v1/pools/b/replicas/r0/undrain")
            await engine_a.aclose()  # a's engine is gone (its last answer finished first)
            ended = await wait_status(client, running, "succeeded", "failed")
            assert ended["pool_id"] == "a"
            for step_id in queued:
                ended = await wait_status(client, step_id, "succeeded")
                assert (ended["pool_id"], ended["replica_id"]) == ("b", "r0")
                assert ended["placement_decision"]["moved_from"] == "a"
    finally:
        await engine_a.aclose()
        await engine_b.aclose()
