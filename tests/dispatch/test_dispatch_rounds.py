"""Claim rounds: each costs a write transaction, so the dispatcher runs one when steps may
be waiting, not after every step that ends. The dispatcher's poll is set long here, so a
round that should have run and did not shows as a step that never starts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from orchestratord import dispatcher
from orchestratord.api.app import create_app
from orchestratord.pools.registry import Replica
from orchestratord.runtime import Orchestrator
from orchestratord.steps.queries import claim_queued
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import make_flow, make_run, submit, wait_status

# the dispatcher's rounds are counted on SQLite (PostgreSQL's polls for other processes'
# steps add rounds of their own: test_dispatch_rounds_pg.py); a submission's start, its queue
# and its slot on both (PostgreSQL stores a started step in one statement of its own)
_SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The pool of every claim round the dispatcher runs."""
    seen: list[str | None] = []
    claim = claim_queued  # what the dispatcher imported

    async def counted(session: Any, *, pool_id: str | None, **kw: Any) -> Any:
        seen.append(pool_id)
        return await claim(session, pool_id=pool_id, **kw)

    monkeypatch.setattr(dispatcher, "claim_queued", counted)
    return seen


class _QuietPolls:
    """Counts the dispatcher's polls that no wake-up came before (its waits of ``poll_s``
    that ran out)."""

    def __init__(self, target: dispatcher.Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._polled = asyncio.Event()
        real = target._quiet_poll

        def counted() -> None:
            real()
            self.count += 1
            self._polled.set()

        monkeypatch.setattr(target, "_quiet_poll", counted)

    async def passed(self, n: int) -> None:
        """Until ``n`` more polls have run."""
        until = self.count + n
        while self.count < until:
            self._polled.clear()
            await asyncio.wait_for(self._polled.wait(), 30)


_ORCH: list[Orchestrator] = []  # the service behind the latest client


async def _client(db_url: str, slots: int, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    orch = Orchestrator(
        make_settings(db_url, dispatch={"poll_s": 60.0}, sim={"slots": slots}, **settings)
    )
    await orch.start()
    _ORCH.append(orch)
    try:
        async with (
            serve_app(create_app(orchestrator=orch)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as c,
        ):
            yield c
    finally:
        await orch.stop()


@pytest.fixture
async def one_slot(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(db_url, 1):
        yield c


@pytest.fixture
async def slots(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(db_url, 8):
        yield c


@_SQLITE
async def test_an_ended_step_leaves_no_empty_claim_round(
    slots: httpx.AsyncClient, rounds: list[str | None]
) -> None:
    run_id = await make_run(slots)
    step_id = (await submit(slots, run_id, token="warm", max_tokens=2)).json()["step_id"]
    await wait_status(slots, step_id, "succeeded")
    rounds.clear()
    for i in range(5):
        step_id = (await submit(slots, run_id, token=f"t{i}", max_tokens=2)).json()["step_id"]
        await wait_status(slots, step_id, "succeeded")
    pool_rounds = [p for p in rounds if p is not None]
    # each step started with its submission (the pool had a free slot): no claim round for
    # it, and none after it ended (a slow health check may add one)
    assert len(pool_rounds) <= 1, pool_rounds


@_SQLITE
async def test_steps_queued_behind_a_full_pool_start_as_slots_free(
    one_slot: httpx.AsyncClient,
) -> None:
    run_id = await make_run(one_slot)
    ids = [
        (await submit(one_slot, run_id, token=f"t{i}", max_tokens=4)).json()["step_id"]
        for i in range(4)
    ]
    for step_id in ids:  # each within wait_status's 10 s, far less than the 60 s poll
        await wait_status(one_slot, step_id, "succeeded")


async def test_a_step_with_a_free_slot_starts_with_its_submission(
    slots: httpx.AsyncClient, rounds: list[str | None]
) -> None:
    run_id = await make_run(slots)
    r = await submit(slots, run_id, token="now", max_tokens=2)
    assert r.status_code == 202 and r.json()["status"] == "running"
    step = await wait_status(slots, r.json()["step_id"], "succeeded")
    assert step["replica_id"] is not None and step["started_at"] is not None
    assert [p for p in rounds if p is not None] == []  # never claimed by a round
    again = await submit(slots, run_id, token="now", max_tokens=2)
    assert again.status_code == 200 and again.json()["step_id"] == r.json()["step_id"]


async def _submit(c: httpx.AsyncClient, run_id: str, token: str, priority: str) -> httpx.Response:
    body: dict[str, Any] = {"type": "llm_call", "client_token": token, "priority": priority}
    body["input"] = {"prompt": "p", "params": {"max_tokens": 2}}
    return await c.post(f"/v1/runs/{run_id}/steps", json=body)


async def test_a_step_waits_behind_the_queue_of_its_pool(slots: httpx.AsyncClient) -> None:
    """The queue's order holds: while steps of its priority (or higher) wait for the pool, a
    new step does not take a free slot ahead of them; a step of a higher priority may."""
    orch = _ORCH[-1]
    run_id = await make_run(slots)
    orch.dispatcher.pause()  # these wait in the queue
    waiting = [(await _submit(slots, run_id, f"b{i}", "batch")).json() for i in range(2)]
    orch.dispatcher.paused = False  # slots are free again, and no round has run (poll: 60 s)
    late = (await _submit(slots, run_id, "late", "batch")).json()
    assert [s["status"] for s in [*waiting, late]] == ["queued"] * 3
    urgent = (await _submit(slots, run_id, "urgent", "interactive")).json()
    assert urgent["status"] == "running"  # interactive goes before batch in any case
    orch.dispatcher.wake()
    ended = [await wait_status(slots, s["step_id"], "succeeded") for s in [*waiting, late]]
    assert [s["started_at"] for s in ended] == sorted(s["started_at"] for s in ended)


async def test_a_step_behind_a_full_queue_is_refused_and_gives_its_slot_back(
    slots: httpx.AsyncClient,
) -> None:
    """A free slot, but steps wait ahead of it in a queue that is full: the step is not
    started, it is refused as any step would be (429), and the slot stays free."""
    orch = _ORCH[-1]
    run_id = await make_run(slots)
    orch.dispatcher.pause()
    waiting = [(await _submit(slots, run_id, f"w{i}", "batch")).json() for i in range(2)]
    orch.dispatcher.paused = False  # free slots again, and no round has run (poll: 60 s)
    policy = orch.submit_context.admission
    orch.submit_context = replace(
        orch.submit_context,
        admission=replace(policy, capacity={**policy.capacity, "batch": 2}),
    )
    full = await _submit(slots, run_id, "full", "batch")
    assert full.status_code == 429, full.text
    assert orch.pools.pools["local"].free_slots == 8
    assert len((await slots.get(f"/v1/runs/{run_id}/steps")).json()) == 2
    orch.dispatcher.wake()
    for s in waiting:
        await wait_status(slots, s["step_id"], "succeeded")


async def test_a_draining_process_starts_nothing_at_submission(
    slots: httpx.AsyncClient,
) -> None:
    run_id = await make_run(slots)
    orch = _ORCH[-1]
    orch.dispatcher.pause()
    r = await submit(slots, run_id, token="late", max_tokens=2)
    assert r.json()["status"] == "queued"
    assert orch.pools.pools["local"].free_slots == 8


async def test_a_submission_that_does_not_commit_gives_its_slot_back(
    slots: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    orch = _ORCH[-1]
    run_id = await make_run(slots)

    def fail(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("the commit did not happen")

    # raised inside the submission's transaction, after the step took its slot
    monkeypatch.setattr(orch.hub, "expect_step", fail)
    r = await submit(slots, run_id, token="lost", max_tokens=2)
    assert r.status_code == 500
    assert orch.pools.pools["local"].free_slots == 8
    assert (await slots.get(f"/v1/runs/{run_id}/steps")).json() == []


async def test_a_step_refused_after_taking_its_slot_gives_it_back(
    slots: httpx.AsyncClient,
) -> None:
    """The slot is taken before the reservation: a step its budget refuses leaves it."""
    orch = _ORCH[-1]
    run_id = await make_run(slots, budgets={"max_tokens_out": 2})
    spent = await submit(slots, run_id, token="spent", max_tokens=2)
    await wait_status(slots, spent.json()["step_id"], "succeeded")
    refused = await submit(slots, run_id, token="refused", max_tokens=2)
    assert refused.status_code == 409 and refused.json()["code"] == "BUDGET_EXCEEDED"
    assert orch.pools.pools["local"].free_slots == 8
    other = await make_run(slots)
    fits = await submit(slots, other, token="fits", max_tokens=2)
    assert fits.json()["status"] == "running", fits.text
    await wait_status(slots, fits.json()["step_id"], "succeeded")
    assert orch.pools.pools["local"].free_slots == 8


async def test_a_slot_given_back_by_a_refused_step_starts_a_step_queued_meanwhile(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submission that took the pool's only slot is refused (its budget): a step queued
    while it held the slot starts when it gives the slot back, not a poll later (the
    dispatcher polls every 60 s here, and no health round wakes it)."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite's writes take turns: no step is queued while a submission runs")
    async for one_slot in _client(db_url, 1, health_interval_s=3600.0):
        await _queued_while_a_slot_is_held(one_slot, monkeypatch)


async def _queued_while_a_slot_is_held(
    one_slot: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestratord.steps import submission

    orch = _ORCH[-1]
    other = await make_run(one_slot)
    run_id = await make_run(one_slot, budgets={"max_tokens_out": 2})
    spent = await submit(one_slot, run_id, token="spent", max_tokens=2)
    await wait_status(one_slot, spent.json()["step_id"], "succeeded")
    holding, go_on = asyncio.Event(), asyncio.Event()
    real = submission.Insert.apply

    async def paused(self: Any, sub: Any) -> Any:
        if sub.run_id == run_id:  # the slot taken (StartNow), the budget not yet checked
            holding.set()
            await go_on.wait()
        return await real(self, sub)

    monkeypatch.setattr(submission.Insert, "apply", paused)
    refused = asyncio.create_task(submit(one_slot, run_id, token="refused", max_tokens=2))
    try:
        await holding.wait()
        assert orch.pools.pools["local"].free_slots == 0
        queued = await submit(one_slot, other, token="queued", max_tokens=2)
        assert queued.json()["status"] == "queued", queued.text
    finally:
        go_on.set()
    assert (await refused).json()["code"] == "BUDGET_EXCEEDED"
    step = await asyncio.wait_for(
        wait_status(one_slot, queued.json()["step_id"], "succeeded"), timeout=10
    )
    assert step["status"] == "succeeded"


@_SQLITE
async def test_an_idle_server_on_sqlite_runs_no_claim_round_on_its_polls(
    db_url: str, rounds: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process owns a SQLite file: every submission, requeue and health refresh wakes
    the dispatcher, so a poll that found the queues empty last time has nothing to find."""
    orch = Orchestrator(make_settings(db_url, dispatch={"poll_s": 0.02}, health_interval_s=3600.0))
    await orch.start()
    polls = _QuietPolls(orch.dispatcher, monkeypatch)
    try:
        async with (
            serve_app(create_app(orchestrator=orch)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as c,
        ):
            run_id = await make_run(c)
            step_id = (await submit(c, run_id, token="a", max_tokens=2)).json()["step_id"]
            await wait_status(c, step_id, "succeeded")
            await polls.passed(5)  # the rounds after it
            rounds.clear()
            await polls.passed(15)
            assert rounds == []
            # a submission still starts (with its submission, or by the round it wakes)
            step_id = (await submit(c, run_id, token="b", max_tokens=2)).json()["step_id"]
            await wait_status(c, step_id, "succeeded")
    finally:
        await orch.stop()


@_SQLITE
async def test_a_step_pinned_to_a_busy_replica_starts_when_that_replica_frees(
    db_url: str,
) -> None:
    """A strict_replay step waits for its recorded replica while another is free. When a step
    ends there, the slot it frees starts it: the round that passed it over left its pool
    marked as holding a backlog, so a freed slot looks (the poll is a minute away)."""
    orch = Orchestrator(
        make_settings(
            db_url,
            dispatch={"poll_s": 60.0},
            health_interval_s=3600.0,
            sim={"tokens_per_s": 100.0, "slots": 1},
        )
    )
    await orch.start()
    try:
        async with (
            serve_app(create_app(orchestrator=orch)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as c,
        ):
            flow_id = await make_flow(c, {"pinned": 1})
            source = await make_run(c, flow_id)
            recorded = (await submit(c, source, "t0", "prompt 0", max_tokens=4)).json()
            await wait_status(c, recorded["step_id"], "succeeded")
            pool = orch.pools.pools["local"]
            r0 = pool.replicas[0]
            r1 = Replica("r1", r0.adapter, slots=1)
            pool.replicas.append(r1)
            r1.busy = r1.slots  # so the long step lands on r0
            long_run = await make_run(c, flow_id)
            long = (await submit(c, long_run, "long", "long", max_tokens=60)).json()["step_id"]
            assert (await wait_status(c, long, "running"))["replica_id"] == "r0"
            r1.busy = 0
            r = await c.post(
                f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": source}
            )
            strict = r.json()["run_id"]
            pinned = (await submit(c, strict, "t0", "prompt 0", max_tokens=4)).json()["step_id"]
            assert (await c.get(f"/v1/steps/{pinned}")).json()["status"] == "queued"
            await wait_status(c, long, "succeeded")
            step = await wait_status(c, pinned, "succeeded", "failed")
            assert step["replica_id"] == "r0" and step["replay_outcome"] == "identical"
    finally:
        await orch.stop()
