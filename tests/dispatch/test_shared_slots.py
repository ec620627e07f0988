"""A replica's slots are the whole service's, not each process's (PostgreSQL).

Three real orchestratord processes on one database share a replica with ``slots: 2``: the
fake engine counts the generations it streams at once. In one process: a slot another
process holds (its step's row says running there) is not taken, is shown by ``GET
/v1/pools``, and is taken once that step ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestratord.db.models import Step
from orchestratord.runtime import Orchestrator
from test_harness.fake_openai import FakeState, Faults
from tests.conftest import make_settings
from tests.fleet import fleet_on, fresh_database, new_run, submit, wait_terminal
from tests.helpers import make_run, started_client, wait_status
from tests.helpers import submit as submit_step


@pytest.fixture
def fresh_db() -> Iterator[str]:
    yield from fresh_database()


@pytest.mark.slow
async def test_three_processes_never_send_a_replica_more_than_its_slots(
    fresh_db: str, tmp_path: Path
) -> None:
    fake = FakeState(faults=Faults(token_delay_s=0.01))
    async with fleet_on(fresh_db, tmp_path, fake, slots=2) as (fleet, _):
        await asyncio.gather(fleet.start("p1"), fleet.start("p2"))
        urls = list(fleet.urls.values())
        clients = [httpx.AsyncClient(base_url=u, timeout=30) for u in urls]
        try:
            runs = await asyncio.gather(*(new_run(c) for c in clients))

            async def ten(i: int) -> list[str]:  # each process takes ten steps at once
                c, run_id = clients[i], runs[i]
                return list(
                    await asyncio.gather(
                        *(submit(c, run_id, f"p{i} step {j}", 20) for j in range(10))
                    )
                )

            steps = [
                s for batch in await asyncio.gather(*(ten(i) for i in range(3))) for s in batch
            ]
            ended = [await wait_terminal(clients[0], s, 60) for s in steps]
            pools = (await clients[1].get("/v1/pools")).json()
        finally:
            for c in clients:
                await c.aclose()
    assert [s["status"] for s in ended] == ["succeeded"] * 30
    assert fake.peak_active == 2  # both slots used, never a third request
    assert sum(fake.completed_by_prompt.values()) == 30
    assert {s["replica_id"] for s in ended} == {"f1"}
    (replica,) = pools[0]["replicas"]
    assert (replica["busy"], replica["free"]) == (0, 2)


def _held_elsewhere(step: Step) -> dict[str, object]:
    """A copy of ``step``'s row as another process running it on its replica would have."""
    row = {c.key: getattr(step, c.key) for c in sa.inspect(Step).columns}
    row.update(
        step_id="stp_elsewhere",
        client_token="elsewhere",
        position=99,
        status="running",
        lease_owner="other#1",
        lease_expires_at=step.created_at.replace(year=2100),
    )
    return row


async def test_a_slot_held_in_another_process_is_not_taken_until_its_step_ends(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite serves one process: its own count is the replica's")
    orch = Orchestrator(make_settings(db_url, sim={"slots": 1}))
    async with started_client(orch, "http://test") as c:
        run_id = await make_run(c)
        first = (await submit_step(c, run_id, token="first")).json()["step_id"]
        await wait_status(c, first, "succeeded")
        async with orch.db.write() as session:
            done = await session.get(Step, first)
            assert done is not None
            await session.execute(sa.insert(Step).values(_held_elsewhere(done)))

        r = await submit_step(c, run_id, token="second")
        assert r.status_code == 202, r.text
        second = r.json()["step_id"]
        (pool,) = (await c.get("/v1/pools")).json()
        assert pool["replicas"][0]["busy"] == 1 and pool["replicas"][0]["free"] == 0
        looks = 0
        looked_twice = asyncio.Event()
        look = orch.dispatcher.slots.look

        async def counted(session: Any, pool: Any) -> None:
            nonlocal looks
            await look(session, pool)
            looks += 1
            if looks == 2:
                looked_twice.set()

        monkeypatch.setattr(orch.dispatcher.slots, "look", counted)
        await asyncio.wait_for(looked_twice.wait(), 10)  # claim rounds: the replica full
        assert (await c.get(f"/v1/steps/{second}")).json()["status"] == "queued"

        async with orch.db.write() as session:  # the other process's step ends
            await session.execute(
                sa.update(Step)
                .where(Step.step_id == "stp_elsewhere")
                .values(status="succeeded", lease_owner=None)
            )
        step = await wait_status(c, second, "succeeded")
        assert step["replica_id"] == "r0"


@pytest.mark.slow
async def test_a_drain_through_one_process_holds_in_every_process(
    fresh_db: str, tmp_path: Path
) -> None:
    """Drained through p0, replica f1 takes no new step from p1 (its running one finishes);
    undrained through p1, p0's steps run there again."""
    fake = FakeState(faults=Faults(token_delay_s=0.01))
    async with fleet_on(fresh_db, tmp_path, fake, slots=2, replicas=("f1", "f2")) as (fleet, _):
        await fleet.start("p1")
        p0, p1 = (httpx.AsyncClient(base_url=u, timeout=30) for u in fleet.urls.values())
        try:
            run_id = await new_run(p0)
            long = await submit(p0, run_id, "runs through the drain", 100)
            running = await wait_running(p0, long)
            r = await p0.post(f"/v1/pools/gpu/replicas/{running['replica_id']}/drain")
            assert r.status_code == 200, r.text
            drained = running["replica_id"]
            other = "f2" if drained == "f1" else "f1"
            steps = await asyncio.gather(*(submit(p1, run_id, f"after {i}", 10) for i in range(6)))
            ended = [await wait_terminal(p1, s, 60) for s in steps]
            assert {s["replica_id"] for s in ended} == {other}
            replicas = (await p1.get("/v1/pools/gpu")).json()["replicas"]
            seen = {x["replica_id"]: x["state"] for x in replicas}
            assert seen == {drained: "draining", other: "ready"}
            assert (await wait_terminal(p0, long, 60))["status"] == "succeeded"

            assert (await p1.post(f"/v1/pools/gpu/replicas/{drained}/undrain")).status_code == 200
            steps = await asyncio.gather(*(submit(p0, run_id, f"again {i}", 10) for i in range(8)))
            ended = [await wait_terminal(p0, s, 60) for s in steps]
            assert {s["status"] for s in ended} == {"succeeded"}
            assert {s["replica_id"] for s in ended} == {"f1", "f2"}  # 8 steps, 2 x 2 slots
        finally:
            await p0.aclose()
            await p1.aclose()
    assert fake.peak_active <= 4


async def wait_running(c: httpx.AsyncClient, step_id: str) -> dict[str, Any]:
    from tests.fleet import on_commits

    async def running() -> dict[str, Any] | None:
        body: dict[str, Any] = (await c.get(f"/v1/steps/{step_id}")).json()
        return body if body["status"] == "running" else None

    return await on_commits(running, 30, f"step {step_id} running")
