"""Two orchestratord processes on one PostgreSQL database share a run's budget."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from orchestratord.eventlog import WAKE_CHANNEL
from orchestratord.streams.wakeups import asyncpg_dsn
from tests.pg import empty_database
from tests.procs import orchestratord

pytestmark = pytest.mark.slow


@pytest.fixture
def shared_pg(pg_url: str) -> Iterator[str]:
    yield pg_url
    empty_database(pg_url)


def test_500_steps_two_processes_never_overspend(shared_pg: str, tmp_path: Path) -> None:
    env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "0", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}
    args = ("--engine", "sim", "--database-url", shared_pg)
    with orchestratord(tmp_path, *args, env=env) as a, orchestratord(tmp_path, *args, env=env) as b:
        asyncio.run(_race(a, b, shared_pg))


async def _race(a: str, b: str, db_url: str) -> None:
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:
        flow = (await c.post(f"{a}/v1/flows", json={"ast": {"race": 1}})).json()
        run = (
            await c.post(
                f"{a}/v1/flows/{flow['flow_id']}/runs",
                json={"seed": 1, "budgets": {"max_tokens_out": 1500}},
            )
        ).json()
        run_id = run["run_id"]

        async def one(i: int) -> httpx.Response:
            base = a if i % 2 == 0 else b
            for attempt in range(3):
                try:
                    return await c.post(
                        f"{base}/v1/runs/{run_id}/steps",
                        json={
                            "type": "llm_call",
                            "client_token": f"k{i}",
                            "input": {"prompt": "race", "params": {"max_tokens": 7}},
                        },
                    )
                except httpx.TransportError:
                    # a kept-alive connection the server closed as it was reused (a slow
                    # client on a loaded machine): sent again, as a client does; the
                    # client_token makes the retry the same step
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

        responses = await asyncio.gather(*(one(i) for i in range(500)))
        accepted = [r.json()["step_id"] for r in responses if r.status_code == 202]
        refused = [r for r in responses if r.status_code != 202]
        assert refused, "the budget should have run out"
        assert {r.status_code for r in refused} == {409}
        assert {r.json()["code"] for r in refused} == {"BUDGET_EXCEEDED"}
        await _all_succeeded(db_url, accepted)
        states = await asyncio.gather(*(c.get(f"{a}/v1/steps/{s}") for s in accepted))
        per_step = [st.json()["usage"]["tokens_out"] for st in states]
        assert all(st.json()["status"] == "succeeded" for st in states)
        served_by = {st.json()["provenance"]["replica_id"] for st in states}
        assert served_by == {"r0"}
        final = (await c.get(f"{b}/v1/runs/{run_id}")).json()
        assert final["usage"]["tokens_out"] == sum(per_step) <= 1500
        assert final["usage"]["tokens_out"] >= 1500 - 6
        assert final["reserved"]["tokens_out"] == 0


async def _all_succeeded(db_url: str, steps: list[str]) -> None:
    """Until every one of ``steps`` has succeeded: counted again each time a process commits
    events (their NOTIFY), not on a timer."""
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    committed = asyncio.Event()
    await conn.add_listener(WAKE_CHANNEL, lambda *_: committed.set())
    try:
        async with asyncio.timeout(120):
            while True:
                committed.clear()  # before counting: a commit meanwhile counts again
                left = await conn.fetchval(
                    "SELECT count(*) FROM steps WHERE step_id = ANY($1::text[])"
                    " AND status <> 'succeeded'",
                    steps,
                )
                if left == 0:
                    return
                await committed.wait()
    finally:
        await conn.close()
