"""Replay edge cases: pinned replicas, budget stops, cancels, absent pools, imported records."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx
import orjson

from orchestratord.pools.registry import Replica
from orchestratord.runtime import Orchestrator
from test_harness.perturbed import PerturbedAdapter
from tests.helpers import make_flow, make_run, submit, wait_status
from worker_adapters.base import Capabilities, Health
from worker_adapters.sim import SimAdapter

ENDED = ("succeeded", "failed", "cancelled")


async def _record(client: httpx.AsyncClient, n: int = 1, **run: Any) -> tuple[str, str, list[str]]:
    flow_id = await make_flow(client, {"replay": "edges"})
    run_id = await make_run(client, flow_id, **run)
    ids = []
    for i in range(n):
        r = await submit(client, run_id, f"t{i}", f"prompt {i}", max_tokens=8)
        ids.append(r.json()["step_id"])
        await wait_status(client, ids[-1], *ENDED)
    return flow_id, run_id, ids


async def _replay(
    client: httpx.AsyncClient, flow_id: str, source: str, mode: str, **kw: Any
) -> str:
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": mode, "source_run_id": source, **kw}
    )
    assert r.status_code == 201, r.text
    run_id: str = r.json()["run_id"]
    return run_id


async def test_a_pinned_step_waits_without_holding_back_the_pool(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, _ = await _record(live)
    pool = orch.pools.pools["local"]
    r0 = pool.replicas[0]
    pool.replicas.append(Replica("r1", r0.adapter, slots=1))
    r0.busy = r0.slots  # the recorded replica is full; r1 is free
    strict = await _replay(live, flow_id, source, "strict_replay")
    pinned = (await submit(live, strict, "t0", "prompt 0", max_tokens=8)).json()["step_id"]
    other_run = await make_run(live, flow_id)
    other = (await submit(live, other_run, "x", "unrelated", max_tokens=4)).json()["step_id"]
    done = await wait_status(live, other, *ENDED)
    assert done["replica_id"] == "r1"
    assert (await live.get(f"/v1/steps/{pinned}")).json()["status"] == "queued"
    r0.busy = 0  # its replica frees up: it runs there
    orch.dispatcher.wake()
    step = await wait_status(live, pinned, *ENDED)
    assert step["replica_id"] == "r0" and step["replay_outcome"] == "identical"


async def test_a_strict_step_cancelled_while_queued_is_reported_cancelled(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, _ = await _record(live)
    r0 = orch.pools.pools["local"].replicas[0]
    r0.busy = r0.slots
    strict = await _replay(live, flow_id, source, "strict_replay")
    step_id = (await submit(live, strict, "t0", "prompt 0", max_tokens=8)).json()["step_id"]
    await live.post(f"/v1/steps/{step_id}/cancel")
    step = await wait_status(live, step_id, "cancelled")
    r0.busy = 0
    assert step["replay_outcome"] == "cancelled"
    report = (await live.get(f"/v1/runs/{strict}/replay-report")).json()
    assert report["steps"][0]["outcome"] == "cancelled" and report["diverged"] is True


async def test_a_budget_stop_before_the_recorded_end_is_a_divergence(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, recorded = await _record(live)
    rec = (await live.get(f"/v1/steps/{recorded[0]}")).json()
    assert rec["usage"]["tokens_out"] == 8
    adapter = orch.pools.pools["local"].replicas[0].adapter
    assert isinstance(adapter, SimAdapter)
    adapter.tokens_per_s = 20.0  # the replica got slower: the wall budget stops it early
    strict = await _replay(live, flow_id, source, "strict_replay")
    r = await live.post(  # the step's own wall budget counts from its start, not the run's
        f"/v1/runs/{strict}/steps",
        json={
            "type": "llm_call",
            "client_token": "t0",
            "input": {"prompt": "prompt 0", "params": {"max_tokens": 8}},
            "budgets": {"max_wall_ms": 150},
        },
    )
    assert r.status_code == 202, r.text
    step_id = r.json()["step_id"]
    step = await wait_status(live, step_id, *ENDED)
    assert step["replay_outcome"] == "diverged"
    divergence = step["error"]["details"]["divergence"]
    n = step["usage"]["tokens_out"]
    assert divergence["token_index"] == n < 8
    assert divergence["actual"] == {"end": "budget"}
    assert divergence["expected"]["token_id"] == rec["output"]["token_ids"][n]


async def test_replay_needs_neither_the_recorded_pool_nor_its_model_name(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    model = orch.pools.pools["local"].model_name
    policy = {
        "rules": [{"id": "m", "effect": "redact", "match": {"model": model}, "pattern": "secret"}]
    }
    flow_id = await make_flow(live, {"replay": "pool-gone"})
    source = await make_run(live, flow_id, policy=policy)
    recorded = (await submit(live, source, "s", "my secret", max_tokens=8)).json()["step_id"]
    rec = await wait_status(live, recorded, "succeeded")
    assert "secret" not in rec["input"]["prompt"]
    # this server no longer has the recorded pool: replay serves the record anyway
    pool = orch.pools.pools.pop("local")
    pool.pool_id = "elsewhere"
    orch.pools.pools["elsewhere"] = pool
    replay = await _replay(live, flow_id, source, "replay")
    step_id = (await submit(live, replay, "s", "my secret", max_tokens=8)).json()["step_id"]
    step = await wait_status(live, step_id, *ENDED)
    assert step["replay_outcome"] == "identical", step["error"]
    assert step["output"] == rec["output"]


async def test_an_unknown_price_table_refuses_strict_replay_only(
    live: httpx.AsyncClient,
) -> None:
    flow_id, source, _ = await _record(live)
    bundle = (await live.get(f"/v1/runs/{source}/export")).json()
    other = _renamed(bundle, "run_other", {"price_table": "1999-01-01"})
    imported = await live.post("/v1/runs:import", json=other)
    assert imported.status_code == 201, imported.text
    r = await live.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": "run_other"}
    )
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "source_run_id"
    replay = await _replay(live, flow_id, "run_other", "replay")
    step_id = (await submit(live, replay, "t0", "prompt 0", max_tokens=8)).json()["step_id"]
    assert (await wait_status(live, step_id, *ENDED))["replay_outcome"] == "identical"


async def test_import_refuses_unknown_states(live: httpx.AsyncClient) -> None:
    _, source, _ = await _record(live)
    bundle = (await live.get(f"/v1/runs/{source}/export")).json()
    for run_fields, field in (({"status": "bogus"}, "run.status"), ({"mode": "x"}, "run.mode")):
        r = await live.post("/v1/runs:import", json=_renamed(bundle, "run_bad", run_fields))
        assert r.status_code == 422
        assert r.json()["details"]["errors"][0]["field"] == field
    steps = [{**s, "priority": "urgent"} for s in bundle["steps"]]
    r = await live.post("/v1/runs:import", json={**_renamed(bundle, "run_bad2", {}), "steps": []})
    assert r.status_code == 422  # its events name a step the bundle lacks
    bad = _renamed({**bundle, "steps": steps}, "run_bad3", {})
    r = await live.post("/v1/runs:import", json=bad)
    assert r.json()["details"]["errors"][0]["field"] == "steps[0].priority"
    assert (await live.get("/v1/runs/run_bad3")).status_code == 404


def _renamed(bundle: dict[str, Any], run_id: str, run_fields: dict[str, Any]) -> dict[str, Any]:
    """The same record under other run and step ids (as if recorded elsewhere)."""
    ids = {s["step_id"]: f"step_{run_id}_{i}" for i, s in enumerate(bundle["steps"])}
    events = []
    for ev in bundle["events"]:
        data = orjson.loads(ev["data"])
        data["step_id"] = ids.get(data["step_id"], data["step_id"])
        events.append(
            {
                **ev,
                "run_id": run_id,
                "step_id": ids.get(ev["step_id"], ev["step_id"]),
                "data": orjson.dumps(data).decode(),
            }
        )
    return {
        **bundle,
        "run": {**bundle["run"], "run_id": run_id, **run_fields},
        "steps": [{**s, "run_id": run_id, "step_id": ids[s["step_id"]]} for s in bundle["steps"]],
        "events": events,
        "facts": [],
        "checkpoints": [],
    }


async def test_replay_waits_for_nothing_when_the_run_is_cancelled(
    live: httpx.AsyncClient,
) -> None:
    flow_id, source, _ = await _record(live)
    replay = await _replay(live, flow_id, source, "replay")
    await live.post(f"/v1/runs/{replay}/cancel")
    r = await submit(live, replay, "t0", "prompt 0", max_tokens=8)
    assert r.status_code == 409 and r.json()["code"] == "RUN_ENDED"
    await asyncio.sleep(0)


class _Upgraded(PerturbedAdapter):
    """The same engine reporting another build (what a rolling upgrade looks like)."""

    version = "1.0-r1"
    model_hash: str | None = None

    async def capabilities(self) -> Capabilities:
        caps = await super().capabilities()
        return dataclasses.replace(
            caps, engine_version=self.version, model_hash=self.model_hash or caps.model_hash
        )


async def test_engine_identity_is_each_replicas_own(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    pool = orch.pools.pools["local"]
    r0 = pool.replicas[0]
    upgraded = _Upgraded(r0.adapter)
    pool.replicas.append(Replica("r1", upgraded, slots=1))
    await orch.pools.refresh()
    r0.busy = r0.slots  # the step lands on r1
    flow_id, source, recorded = await _record(live)
    r0.busy = 0
    step = (await live.get(f"/v1/steps/{recorded[0]}")).json()
    assert step["replica_id"] == "r1"
    assert step["provenance"]["engine_version"] == "1.0-r1"
    upgraded.model_hash = "sha256:" + "2" * 64
    await orch.pools.refresh()
    r = await live.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": source}
    )
    assert r.status_code == 409
    assert r.json()["details"]["mismatches"] == [
        {
            "input": "model_hash",
            "pool_id": "local",
            "replica_id": "r1",
            "recorded": r0.capabilities["model_hash"],
            "current": "sha256:" + "2" * 64,
        }
    ]


class _Down(PerturbedAdapter):
    async def health(self) -> Health:
        return Health(live=False, ready=False, detail="restarting")


async def test_strict_steps_are_refused_retriably_while_their_replica_is_down(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    flow_id, source, _ = await _record(live)
    strict = await _replay(live, flow_id, source, "strict_replay")
    replica = orch.pools.pools["local"].replicas[0]
    engine = replica.adapter
    replica.adapter = _Down(engine)  # what the health checks will keep seeing
    await orch.pools.refresh()
    r = await submit(live, strict, "t0", "prompt 0", max_tokens=8)
    assert r.status_code == 503
    body = r.json()
    assert body["code"] == "POOL_UNAVAILABLE" and body["retriable"] is True
    assert body["details"] == {"pool_id": "local", "replica_id": "r0"}
    assert r.headers["Retry-After"] == "1"
    replica.adapter = engine
    await orch.pools.refresh()
    again = await submit(live, strict, "t0", "prompt 0", max_tokens=8)  # the retry is accepted
    assert again.status_code == 202
    step = await wait_status(live, again.json()["step_id"], *ENDED)
    assert step["position"] == 0 and step["replay_outcome"] == "identical"
