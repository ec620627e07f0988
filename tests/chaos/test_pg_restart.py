"""PostgreSQL restarted under two real ``orchestratord serve`` processes streaming 50 steps.

A throwaway cluster (``initdb``/``pg_ctl`` on a free port) is restarted with ``pg_ctl
restart`` while every step streams, then stopped for longer than a lease and started
again. Through both: every accepted step ends, every stream (resumed with ``Last-Event-ID``
whenever it breaks or a reconnect is refused) has no gap and no duplicate, what a stream
said is what the step's record holds, submissions while the database is down answer 503
``DATABASE_UNAVAILABLE`` with ``Retry-After`` and store nothing, a step that wrote nothing
during the outage is not taken from the process that lived through it, and nothing is left
held (running steps, shared slots, budget reservations).

The streaming steps live through both: the event writer waits for the database while it is
unavailable (their producers wait once enough is queued), and they end ``succeeded``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy as sa

from orchestratord.db.engine import Database
from tests.chaos.cluster import Cluster, throwaway_cluster
from tests.chaos.servers import Followed, Server, assert_whole, follow, serving

pytestmark = pytest.mark.slow

STEPS = 50
TOKENS = 60  # at 10 tokens/s: 6 s of streaming per step, across the outage
LEASE_S = 2.0
OUTAGE_S = LEASE_S + 1.5  # every lease expires while the database is down
NAP_MS = 10_000  # tool steps that outlast the outage, writing nothing meanwhile
NAPS = 2  # per process
TERMINAL = ("succeeded", "failed", "cancelled")
ENV = {
    "ORCHESTRATORD_SIM__TOKENS_PER_S": "10",
    "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
    "ORCHESTRATORD_SIM__SLOTS": str(STEPS + 8),  # every step streams at once
    "ORCHESTRATORD_DISPATCH__LEASE_S": str(LEASE_S),
    "ORCHESTRATORD_DISPATCH__POLL_S": "0.2",
    "ORCHESTRATORD_STREAM__POLL_S": "0.2",
    "ORCHESTRATORD_DB_POOL_SIZE": "6",
    "ORCHESTRATORD_DB_MAX_OVERFLOW": "4",
    "ORCHESTRATORD_LOG_LEVEL": "warning",
    # whether any API key exists is asked of the database again every second: the outage
    # meets that look too (answered 503, as every other)
    "ORCHESTRATORD_AUTH__CACHE_S": "1",
}
NAP_TOOL = {
    "name": "nap",
    "description": "sleeps",
    "executor": {"kind": "builtin", "name": "sleep"},
    "parameters": {"type": "object", "properties": {"ms": {"type": "integer"}}},
}


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with throwaway_cluster() as c:
        yield c


async def _run(c: httpx.AsyncClient) -> str:
    r = await c.post("/v1/flows", json={"ast": {"chaos": "pg-restart"}, "tools": [NAP_TOOL]})
    assert r.status_code in (200, 201), r.text
    r = await c.post(f"/v1/flows/{r.json()['flow_id']}/runs", json={"seed": 5})
    assert r.status_code == 201, r.text
    return str(r.json()["run_id"])


def _step(token: str) -> dict[str, Any]:
    return {
        "type": "llm_call",
        "client_token": token,
        "input": {"prompt": f"chaos {token}", "params": {"max_tokens": TOKENS}},
    }


def _nap(token: str) -> dict[str, Any]:
    return {
        "type": "tool_call",
        "client_token": token,
        "input": {"tool": "nap", "args": {"ms": NAP_MS}},
    }


_STREAMING = "SELECT count(DISTINCT step_id) FROM events WHERE type = 'token'"


async def test_pg_restart_while_two_processes_stream(cluster: Cluster, tmp_path: Path) -> None:
    async with serving(tmp_path, cluster.url, ["p0", "p1"], ENV) as servers:
        try:
            await _scenario(cluster, list(servers.values()))
        except BaseException:
            for server in servers.values():
                print(f"--- {server.name} log ---\n{server.log_tail()}")
            raise


async def _scenario(cluster: Cluster, servers: list[Server]) -> None:
    clients = [httpx.AsyncClient(base_url=s.url, timeout=10) for s in servers]
    follows: list[asyncio.Task[Followed]] = []
    try:
        runs = [await _run(c) for c in clients]
        steps: list[str] = []
        for i in range(STEPS):  # half through each process
            k = i % 2
            r = await clients[k].post(f"/v1/runs/{runs[k]}/steps", json=_step(f"s{i}"))
            assert r.status_code == 202, r.text
            steps.append(r.json()["step_id"])
        naps: list[str] = []
        for i in range(2 * NAPS):
            k = i % 2
            r = await clients[k].post(f"/v1/runs/{runs[k]}/steps", json=_nap(f"nap{i}"))
            assert r.status_code == 202, r.text
            naps.append(r.json()["step_id"])
        # each step followed through one process or the other (half of them across)
        follows += [
            asyncio.create_task(follow(clients[(i // 2) % 2], sid, within_s=45))
            for i, sid in enumerate(steps + naps)
        ]
        # every step streaming (its tokens committed) before the database goes away
        conn = await asyncpg.connect(cluster.url)
        try:
            deadline = time.monotonic() + 10
            while await conn.fetchval(_STREAMING) < STEPS:
                assert time.monotonic() < deadline, "the steps did not all start streaming"
                await asyncio.sleep(0.1)
        finally:
            await conn.close()

        # 1. pg_ctl restart: every session terminated, the server back at once; reads are
        # answered again at once
        await asyncio.to_thread(cluster.restart)
        for k, c in enumerate(clients):
            for sid in steps[:8]:
                r = await c.get(f"/v1/steps/{sid}")
                assert r.status_code == 200, (k, r.status_code, r.text)

        # 2. down for longer than a lease: submissions (and reads) refused, retriable,
        # nothing stored
        await asyncio.to_thread(cluster.stop)
        down_at = time.monotonic()
        outage: list[tuple[int, str]] = []
        while time.monotonic() - down_at < OUTAGE_S:
            for k, c in enumerate(clients):
                token = f"outage-{len(outage)}"
                r = await c.post(f"/v1/runs/{runs[k]}/steps", json=_step(token))
                _assert_unavailable(r)
                outage.append((k, token))
                _assert_unavailable(await c.get(f"/v1/steps/{steps[k]}"))
            await asyncio.sleep(0.2)
        await asyncio.to_thread(cluster.start)
        # new work is taken again at once (a connection that a process held across the
        # outage fails the one write that finds it, retriably)
        for c in clients:
            back = time.monotonic()
            while (
                r := await c.post("/v1/flows", json={"ast": {"after": "outage"}})
            ).status_code == 503:
                _assert_unavailable(r)
                assert time.monotonic() - back < 5, "writes not taken again within 5 s"
                await asyncio.sleep(0.05)
            assert r.status_code in (200, 201), r.text

        # 3. every accepted step ends; every stream whole across its resumes
        seen: list[Followed] = await asyncio.gather(*follows)
        for followed in seen:
            assert_whole(followed)
        ended = {}
        for i, sid in enumerate(steps + naps):
            body = (await clients[i % 2].get(f"/v1/steps/{sid}")).json()
            assert body["status"] in TERMINAL, body
            ended[sid] = body
        # what the stream said is what the record holds
        for followed in seen:
            body = ended[followed.step_id]
            last = followed.events[-1]
            assert (last.event == "end") == (body["status"] == "succeeded"), (last, body)
        # a step whose process lived through the outage is not taken from it: its lease
        # expired while nobody could renew it, and no process reaps it once the database is
        # back before its holder has had a lease's time to renew it
        for sid in naps:
            assert ended[sid]["status"] == "succeeded", ended[sid]
        # and a step that streamed through the outage goes on once the database is back
        for sid in steps:
            assert ended[sid]["status"] == "succeeded", ended[sid]
        outcomes = Counter(
            f"{b['status']} {(b.get('error') or {}).get('code', '')}".strip()
            for b in ended.values()
        )
        print(f"outcomes: {dict(outcomes)}; reconnects: {sum(f.reconnects for f in seen)}")

        # 4. nothing submitted during the outage was stored, even in part; a retry of it
        # (same client token) runs it once
        conn = await asyncpg.connect(cluster.url)
        try:
            tokens = [token for _, token in outage]
            stored = await conn.fetchval(
                "SELECT count(*) FROM steps WHERE client_token = ANY($1::text[])", tokens
            )
            assert stored == 0, f"{stored} steps of refused submissions were stored"
            retried = []
            for k, token in outage[:4]:
                r = await clients[k].post(f"/v1/runs/{runs[k]}/steps", json=_step(token))
                assert r.status_code == 202, r.text
                again = await clients[1 - k].post(f"/v1/runs/{runs[k]}/steps", json=_step(token))
                assert again.status_code == 200 and again.json()["step_id"] == r.json()["step_id"]
                retried.append(r.json()["step_id"])
            for k, sid in enumerate(retried):
                assert_whole(await follow(clients[k % 2], sid, within_s=20))

            # 5. nothing left held: no step running, no slot taken, no reservation
            running = await conn.fetchval("SELECT count(*) FROM steps WHERE status = 'running'")
            assert running == 0
            reserved = await conn.fetch(
                "SELECT run_id, tokens_in_reserved, tokens_out_reserved FROM runs"
                " WHERE tokens_in_reserved <> 0 OR tokens_out_reserved <> 0"
            )
            assert reserved == [], reserved
        finally:
            await conn.close()
        for c in clients:
            pools = (await c.get("/v1/pools")).json()
            busy = [p["load"]["slots_busy"] for p in _items(pools)]
            assert busy == [0] * len(busy), pools

        # 6. restarted while idle: the next reads are answered (a background round of each
        # process may find a connection the server closed first: it waits for the next)
        await asyncio.to_thread(cluster.restart)
        for k, c in enumerate(clients):
            for path in (f"/v1/steps/{steps[k]}", f"/v1/runs/{runs[k]}", "/v1/pools"):
                r = await c.get(path)
                assert r.status_code == 200, (k, path, r.status_code, r.text)
    finally:
        for task in follows:
            task.cancel()
        await asyncio.gather(*follows, return_exceptions=True)
        for c in clients:
            await c.aclose()


async def test_pooled_connections_closed_by_a_restart_are_not_handed_out(
    cluster: Cluster,
) -> None:
    """The pool's idle connections, closed by the server's restart: the next reads each get
    a new one, where a pool without the check hands the first of them out (one request
    failing for each restart, in every process)."""
    db = Database(cluster.url, pool_size=4)
    try:

        async def read(delay_s: float = 0.0) -> int:
            async with db.read() as session:
                return int(
                    (await session.execute(sa.text(f"SELECT 1, pg_sleep({delay_s})"))).scalar_one()
                )

        await asyncio.gather(*(read(0.05) for _ in range(4)))  # four open, idle, pooled
        await asyncio.to_thread(cluster.restart)
        await asyncio.sleep(0.2)  # asyncpg has seen their sockets close
        assert [await read() for _ in range(6)] == [1] * 6
    finally:
        await db.dispose()


def _items(pools: Any) -> list[dict[str, Any]]:
    return list(pools["items"] if isinstance(pools, dict) else pools)


def _assert_unavailable(r: httpx.Response) -> None:
    """503, retriable, with ``Retry-After`` and the contract's error body."""
    assert r.status_code == 503, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == "DATABASE_UNAVAILABLE", body
    assert body["retriable"] is True and body["retry_after_ms"] >= 1, body
    assert int(r.headers["retry-after"]) >= 1, r.headers
    assert r.headers.get("x-correlation-id") == body["correlation_id"], (r.headers, body)
