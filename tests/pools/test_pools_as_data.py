"""Pools as data through HTTP (admin): created, served, kept over a restart, removed; the
pools file's set replaces what it declared before on reload; bad input names its field."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestratord.runtime import Orchestrator
from test_harness.fake_openai import FakeState
from tests.conftest import make_settings
from tests.fleet import fleet_on, fresh_database, new_run, wait_terminal
from tests.helpers import make_run, started_client, wait_status
from tests.procs import free_port, process

FILE = """
pools:
  - pool_id: declared
    engine: sim
    replicas: [{replica_id: r0, slots: 2}]
"""

NEW_POOL = {
    "pool_id": "extra",
    "engine": "sim",
    "tags": {"region": "eu"},
    "replicas": [{"replica_id": "a", "slots": 3}],
}


def _orch(db_url: str, tmp_path: Path, text: str = FILE, **kw: Any) -> Orchestrator:
    pools = tmp_path / "pools.yaml"
    pools.write_text(text)
    return Orchestrator(make_settings(db_url, pools_file=pools, **kw))


async def _step_on(client: httpx.AsyncClient, run_id: str, token: str, pool: str) -> str:
    body = {
        "type": "llm_call",
        "client_token": token,
        "input": {"prompt": token, "params": {"max_tokens": 4}},
        "placement": {"pin": pool},
    }
    r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["step_id"])


async def _pool_ids(client: httpx.AsyncClient) -> list[str]:
    return sorted(p["pool_id"] for p in (await client.get("/v1/pools")).json())


async def test_a_pool_created_through_the_api_serves_steps_and_outlives_a_restart(
    db_url: str, tmp_path: Path
) -> None:
    async with started_client(_orch(db_url, tmp_path)) as client:
        r = await client.post("/v1/pools", json=NEW_POOL)
        assert r.status_code == 201, r.text
        shown = r.json()
        assert (shown["pool_id"], shown["engine"], shown["tags"]) == (
            "extra",
            "sim",
            {"region": "eu"},
        )
        assert [(x["replica_id"], x["slots"]) for x in shown["replicas"]] == [("a", 3)]
        assert await _pool_ids(client) == ["declared", "extra"]
        again = await client.post("/v1/pools", json=NEW_POOL)  # a retried request
        assert again.status_code == 200, again.text
        other = await client.post("/v1/pools", json={**NEW_POOL, "tags": {"region": "us"}})
        assert other.status_code == 409, other.text
        assert other.json()["details"]["field"] == "pool_id"
        run_id = await make_run(client)
        ended = await wait_status(
            client, await _step_on(client, run_id, "s1", "extra"), "succeeded"
        )
        assert (ended["pool_id"], ended["replica_id"]) == ("extra", "a")
    async with started_client(_orch(db_url, tmp_path)) as client:  # a restart keeps it
        assert await _pool_ids(client) == ["declared", "extra"]
        assert (await client.delete("/v1/pools/extra")).status_code == 204
        assert await _pool_ids(client) == ["declared"]
        assert (await client.get("/v1/pools/extra")).status_code == 404
        assert (await client.delete("/v1/pools/extra")).status_code == 404
        gone = await client.post(
            f"/v1/runs/{await make_run(client)}/steps",
            json={
                "type": "llm_call",
                "client_token": "t",
                "input": {"prompt": "x"},
                "placement": {"pin": "extra"},
            },
        )
        assert gone.status_code == 422, gone.text
        assert gone.json()["details"]["errors"][0]["field"] == "placement.pin"
    async with started_client(_orch(db_url, tmp_path)) as client:  # and the delete too
        assert await _pool_ids(client) == ["declared"]


async def test_a_pool_in_use_or_declared_by_the_file_is_not_deleted(
    db_url: str, tmp_path: Path
) -> None:
    async with started_client(_orch(db_url, tmp_path)) as client:
        r = await client.delete("/v1/pools/declared")
        assert r.status_code == 409, r.text
        assert "pools file" in r.json()["message"]
        slow = {**NEW_POOL, "replicas": [{"replica_id": "a", "slots": 1}]}
        assert (await client.post("/v1/pools", json=slow)).status_code == 201
        await client.post("/v1/pools/extra/replicas/a/drain")  # its step waits queued
        run_id = await make_run(client)
        step_id = await _step_on(client, run_id, "s1", "extra")
        busy = await client.delete("/v1/pools/extra")
        assert busy.status_code == 409, busy.text
        assert busy.json()["details"] == {"pool_id": "extra", "running": 0, "queued": 1}
        assert busy.json()["retriable"] is True
        await client.post("/v1/pools/extra/replicas/a/undrain")
        await wait_status(client, step_id, "succeeded")
        assert (await client.delete("/v1/pools/extra")).status_code == 204


async def test_a_bad_pool_is_refused_naming_the_field_and_nothing_is_stored(
    db_url: str, tmp_path: Path
) -> None:
    async with started_client(_orch(db_url, tmp_path)) as client:
        cases = [
            ({**NEW_POOL, "engine": "nope"}, "engine"),
            ({**NEW_POOL, "replicas": [{"replica_id": "a", "slots": 0}]}, "replicas.0.slots"),
            ({**NEW_POOL, "pool_id": "has space"}, "pool_id"),
            ({**NEW_POOL, "replicas": []}, "replicas"),
            (
                {**NEW_POOL, "engine": "openai", "replicas": [{"replica_id": "a"}]},
                "replicas.0.url",
            ),
        ]
        for body, field in cases:
            r = await client.post("/v1/pools", json=body)
            assert r.status_code == 422, r.text
            fields = [e["field"] for e in r.json()["details"]["errors"]]
            assert any(f.endswith(field) for f in fields), (field, r.json())
        assert await _pool_ids(client) == ["declared"]
        same_as_file = {**NEW_POOL, "pool_id": "declared"}
        assert (await client.post("/v1/pools", json=same_as_file)).status_code == 409


async def test_a_reload_of_the_pools_file_replaces_the_set_it_declared(
    db_url: str, tmp_path: Path
) -> None:
    orch = _orch(db_url, tmp_path)
    async with started_client(orch) as client:
        assert (await client.post("/v1/pools", json=NEW_POOL)).status_code == 201
        (tmp_path / "pools.yaml").write_text(FILE.replace("pool_id: declared", "pool_id: renamed"))
        assert await orch.reload_pools()
        # the file's old pool goes, its new one comes; the API's pool stays
        assert await _pool_ids(client) == ["extra", "renamed"]
        (tmp_path / "pools.yaml").write_text("pools:\n  - pool_id: bad\n    engine: nope\n")
        assert not await orch.reload_pools()  # a broken file changes nothing
        assert await _pool_ids(client) == ["extra", "renamed"]
        run_id = await make_run(client)
        ended = await wait_status(
            client, await _step_on(client, run_id, "s", "renamed"), "succeeded"
        )
        assert ended["pool_id"] == "renamed"


@pytest.fixture
def fresh_db() -> Iterator[str]:
    yield from fresh_database()


@pytest.mark.slow
async def test_a_pool_created_through_one_process_is_served_by_another(
    fresh_db: str, tmp_path: Path
) -> None:
    fake = FakeState()
    async with fleet_on(fresh_db, tmp_path, fake, ORCHESTRATORD_HEALTH_INTERVAL_S="0.2") as (
        fleet,
        _,
    ):
        await fleet.start("p1")
        a, b = (httpx.AsyncClient(base_url=u, timeout=30) for u in fleet.urls.values())
        try:
            gpu = (await a.get("/v1/pools/gpu")).json()
            pool: dict[str, Any] = {
                "pool_id": "second",
                "engine": "openai",
                "replicas": [{**gpu["replicas"][0], "replica_id": "s1", "slots": 2}],
            }
            for key in ("busy", "free", "state", "breaker", "capabilities", "health"):
                pool["replicas"][0].pop(key)
            r = await a.post("/v1/pools", json=pool)
            assert r.status_code == 201, r.text

            async def served_by_b() -> bool:
                return (await b.get("/v1/pools/second")).status_code == 200

            await _within(served_by_b, "p1 serves the pool p0 created")
            run_id = await new_run(b)
            body = {
                "type": "llm_call",
                "client_token": "t",
                "input": {"prompt": "x", "params": {"max_tokens": 3}},
                "placement": {"pin": "second"},
            }
            r = await b.post(f"/v1/runs/{run_id}/steps", json=body)
            assert r.status_code == 202, r.text
            ended = await wait_terminal(b, r.json()["step_id"], 30)
            assert (ended["status"], ended["pool_id"]) == ("succeeded", "second")
            assert (await b.delete("/v1/pools/second")).status_code == 204

            async def gone_from_a() -> bool:
                return (await a.get("/v1/pools/second")).status_code == 404

            await _within(gone_from_a, "p0 lets go of the pool p1 deleted")
        finally:
            await a.aclose()
            await b.aclose()


async def _within(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.05)


def test_sighup_reloads_the_pools_file_of_a_running_server(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(FILE)
    port = free_port()
    args = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port)]
    args += ["--pools", str(pools), "--database-url", f"sqlite:///{tmp_path / 'o.db'}"]
    url = f"http://127.0.0.1:{port}"
    with process(args, ready_url=f"{url}/healthz", cwd=tmp_path) as server:

        def ids() -> list[str]:
            return sorted(p["pool_id"] for p in httpx.get(f"{url}/v1/pools").json())

        assert ids() == ["declared"]
        pools.write_text(FILE + FILE.split("pools:")[1].replace("declared", "added"))
        server.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while ids() != ["added", "declared"]:
            assert time.monotonic() < deadline, ids()
            time.sleep(0.05)
        assert httpx.get(f"{url}/v1/pools/added").json()["source"] == "file"
        assert server.poll() is None  # reloaded, not stopped
