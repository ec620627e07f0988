"""Draining a replica through HTTP (admin): it takes no new step, its running ones finish,
the pools show it, and the drain outlives a restart; undrained, it takes steps again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import make_run, started_client, submit, wait_status

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
