"""Provisioning through HTTP (admin): engines started on this host as child processes,
served as a pool once healthy, stopped on DELETE, when idle past their TTL, and with the
process that started them; a bound on how many run; bad requests name their field."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.helpers import make_run, started_client, until, wait_status
from tests.procs import free_port, process

FAKE = {
    "fake": {
        "command": "{python} -m test_harness.fake_openai_server --host {host} --port {port}",
        "model": "fake-model",
    }
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(pool: dict[str, Any]) -> list[int]:
    return [int(e["pid"]) for e in pool["provision"]["engines"]]


def _orch(db_url: str, **provision: Any) -> Orchestrator:
    provision.setdefault("commands", FAKE)
    return Orchestrator(make_settings(db_url, provision=provision, health_interval_s=0.2))


async def _step(client: httpx.AsyncClient, pool: str, **params: Any) -> dict[str, Any]:
    run_id = await make_run(client)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": "t",
            "input": {"prompt": "The capital of France is", "params": params},
            "placement": {"pin": pool},
        },
    )
    assert r.status_code == 202, r.text
    return await wait_status(client, r.json()["step_id"], "succeeded", "failed")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_llama_cpp_server_pool_is_provisioned_serves_a_step_and_stops_on_delete(
    db_url: str,
) -> None:
    async with started_client(_orch(db_url)) as client:
        r = await client.post(
            "/v1/pools/provision",
            json={
                "pool_id": "gemma",
                "provisioner": "llama_cpp_server",
                "tags": {"kind": "provisioned"},
                "options": {"n_ctx": 512, "n_threads": 1},
            },
        )
        assert r.status_code == 201, r.text
        pool = r.json()
        assert (pool["engine"], pool["source"], pool["health"]) == (
            "openai",
            "provisioned",
            "ready",
        )
        assert pool["provision"]["provisioner"] == "llama_cpp_server"
        (pid,) = _pids(pool)
        assert _alive(pid)
        assert pool["replicas"][0]["url"].startswith("http://127.0.0.1:")
        ended = await _step(client, "gemma", max_tokens=4, temperature=0)
        assert ended["status"] == "succeeded", ended
        assert (ended["pool_id"], ended["replica_id"]) == ("gemma", "r0")
        assert ended["output"]["text"] and 1 <= ended["usage"]["tokens_out"] <= 4, ended
        assert (await client.delete("/v1/pools/gemma")).status_code == 204
        assert not _alive(pid)  # stopped and waited for
        assert [p["pool_id"] for p in (await client.get("/v1/pools")).json()] == ["local"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_an_in_process_llama_pool_is_provisioned_and_removed(db_url: str) -> None:
    async with started_client(_orch(db_url)) as client:
        body = {"pool_id": "inproc", "provisioner": "llama", "options": {"n_ctx": 512}}
        r = await client.post("/v1/pools/provision", json=body)
        assert r.status_code == 201, r.text
        assert (r.json()["engine"], r.json()["provision"]["engines"]) == ("llama", [])
        again = await client.post("/v1/pools/provision", json=body)  # a retried request
        assert again.status_code == 200, again.text
        ended = await _step(client, "inproc", max_tokens=3, temperature=0)
        assert (ended["status"], ended["usage"]["tokens_out"]) == ("succeeded", 3)
        assert (await client.delete("/v1/pools/inproc")).status_code == 204


async def test_the_bound_refuses_more_engines_and_an_idle_pool_goes(db_url: str) -> None:
    async with started_client(_orch(db_url, max_engines=1)) as client:
        first = await client.post(
            "/v1/pools/provision",
            json={"pool_id": "p1", "provisioner": "fake", "idle_ttl_s": 0.5},
        )
        assert first.status_code == 201, first.text
        (pid,) = _pids(first.json())
        over = await client.post(
            "/v1/pools/provision", json={"pool_id": "p2", "provisioner": "fake"}
        )
        assert over.status_code == 409, over.text
        assert over.json()["details"]["limit"] == "provision.max_engines"

        async def gone() -> bool:
            ids = [p["pool_id"] for p in (await client.get("/v1/pools")).json()]
            return "p1" not in ids

        for _ in range(100):  # the health refresh (every 0.2 s) removes it once idle 0.5 s
            if await gone():
                break
            await asyncio.sleep(0.1)
        assert await gone()
        await until(lambda: not _alive(pid))
        second = await client.post(
            "/v1/pools/provision", json={"pool_id": "p2", "provisioner": "fake"}
        )
        assert second.status_code == 201, second.text


async def test_bad_provision_requests_name_their_field(db_url: str, tmp_path: Path) -> None:
    async with started_client(_orch(db_url)) as client:
        cases = [
            ({"pool_id": "x", "provisioner": "nope"}, "provisioner"),
            ({"pool_id": "x", "provisioner": "llama", "model": str(tmp_path / "no.gguf")}, "model"),
            ({"pool_id": "x", "provisioner": "llama", "slots": 2}, "slots"),
            ({"pool_id": "x", "provisioner": "llama", "options": {"n_ctxx": 1}}, "options.n_ctxx"),
            ({"pool_id": "x", "provisioner": "fake", "options": {"a": 1}}, "options"),
            ({"pool_id": "x y", "provisioner": "fake"}, "pool_id"),
            ({"pool_id": "x", "provisioner": "fake", "replicas": 0}, "replicas"),
            ({"pool_id": "local", "provisioner": "fake"}, "pool_id"),
        ]
        for body, field in cases:
            r = await client.post("/v1/pools/provision", json=body)
            assert r.status_code in (409, 422), r.text
            error = r.json()
            fields = [e["field"] for e in error["details"].get("errors", [])] or [
                error["details"].get("field")
            ]
            assert any(str(f).endswith(field) for f in fields), (field, error)
        assert [p["pool_id"] for p in (await client.get("/v1/pools")).json()] == ["local"]


def test_engines_die_with_the_process_that_provisioned_them(tmp_path: Path) -> None:
    env = {
        "ORCHESTRATORD_PROVISION__COMMANDS": json.dumps(FAKE),
        "ORCHESTRATORD_LOG_LEVEL": "warning",
        "ORCHESTRATORD_INSTANCE": "o1",
    }
    db = f"sqlite:///{tmp_path / 'o.db'}"

    def serve() -> tuple[list[str], str]:
        port = free_port()
        args = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port)]
        return [*args, "--engine", "sim", "--database-url", db], f"http://127.0.0.1:{port}"

    args, url = serve()
    with process(args, ready_url=f"{url}/healthz", cwd=tmp_path, env=env) as server:
        r = httpx.post(
            f"{url}/v1/pools/provision", json={"pool_id": "p1", "provisioner": "fake"}, timeout=60
        )
        assert r.status_code == 201, r.text
        (pid,) = _pids(r.json())
        engine = r.json()["replicas"][0]["url"].removesuffix("/v1")
        assert httpx.get(f"{engine}/health").status_code == 200
        server.kill()  # no shutdown: the engine goes with it all the same
        server.wait()
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    # the same instance starting again forgets the pool its earlier life made
    args, url = serve()
    with process(args, ready_url=f"{url}/healthz", cwd=tmp_path, env=env):
        pools = httpx.get(f"{url}/v1/pools").json()
        assert [p["pool_id"] for p in pools] == ["local"]


async def test_an_engine_that_fails_to_start_leaves_no_pool(db_url: str) -> None:
    failing = {"broken": {"command": "{python} -c 'print(\"no GPU here\"); raise SystemExit(3)'"}}
    async with started_client(_orch(db_url, commands=failing)) as client:
        r = await client.post("/v1/pools/provision", json={"pool_id": "b", "provisioner": "broken"})
        assert r.status_code == 503, r.text
        error = r.json()
        assert "exited with status 3" in error["message"]
        assert "no GPU here" in error["details"]["tail"]
        assert [p["pool_id"] for p in (await client.get("/v1/pools")).json()] == ["local"]


async def test_a_pool_deleted_through_another_process_stops_its_engines_here(
    db_url: str,
) -> None:
    from orchestratord.pools import store

    orch = _orch(db_url)
    async with started_client(orch) as client:
        r = await client.post("/v1/pools/provision", json={"pool_id": "p1", "provisioner": "fake"})
        assert r.status_code == 201, r.text
        (pid,) = _pids(r.json())
        async with orch.db.write() as session:  # what DELETE through another process leaves
            assert await store.remove(session, "p1")
        await orch.catalog.sync()  # this process's next refresh
        await until(lambda: not _alive(pid))
        assert [p["pool_id"] for p in (await client.get("/v1/pools")).json()] == ["local"]
