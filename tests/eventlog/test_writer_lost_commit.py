"""The event writer when a commit's outcome is unknown: the connection was lost around it.

The retry must not write the batch again if it committed (its steps would fail on their own
events' keys, or a client would see them twice), and must write it if it did not.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest

from orchestratord.eventlog import EventWriter
from orchestratord.runtime import Orchestrator
from tests.helpers import (
    make_run,
    parse_sse,
    read_run_stream,
    read_stream,
    sleeping_step,
    stored_events,
    submit,
    wait_status,
)

TOKENS = 40


def _lose_once(
    monkeypatch: pytest.MonkeyPatch, *, after_commit: bool, holding: str = "token"
) -> list[list[int | None]]:
    """The first writer round holding an event of type ``holding`` fails with a lost
    connection: after its transaction committed (``after_commit``), or before anything
    reached the database. The seqs of that round's events, once it happened."""
    real = EventWriter._transaction
    lost: list[list[int | None]] = []

    async def losing(self: EventWriter, batch: Any) -> Any:
        first = not lost and any(ev.type == holding for ev in batch.events)
        if first:
            lost.append([ev.seq for ev in batch.events])
        if first and not after_commit:
            raise ConnectionResetError("connection lost before the statement was sent")
        done = await real(self, batch)
        if first:
            raise ConnectionResetError("connection lost before the commit was acknowledged")
        return done

    monkeypatch.setattr(EventWriter, "_transaction", losing)
    return lost


def _handed_on(caplog: pytest.LogCaptureFixture, run_id: str) -> list[tuple[int, str]]:
    """(run cursor, type) of each of the run's events handed on as committed (one log line
    per event on ``orchestratord.events``, then the live followers)."""
    return [
        (r.event["run_seq"], r.event["type"])  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "orchestratord.events" and r.event["run_id"] == run_id  # type: ignore[attr-defined]
    ]


@pytest.mark.parametrize("after_commit", [True, False], ids=["after-commit", "before-commit"])
async def test_a_round_whose_connection_was_lost_is_in_the_log_once(
    client: httpx.AsyncClient,
    live: httpx.AsyncClient,
    orch: Orchestrator,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    after_commit: bool,
) -> None:
    """Committed before the connection went: the retry finds the round in the log and hands
    its events to the followers (with the run cursors they were stored at) instead of
    writing them again. Not committed: the retry writes it. Either way the step succeeds,
    every event is stored once, and live followers of the step and of the run see each
    event once, at its stored cursor."""
    caplog.set_level(logging.DEBUG, logger="orchestratord.events")
    lost = _lose_once(monkeypatch, after_commit=after_commit)
    run_id = await make_run(client)
    before = len(await stored_events(orch.db, run_id=run_id))
    run_follower = asyncio.create_task(read_run_stream(live, run_id, before + TOKENS + 3))
    await asyncio.sleep(0.05)  # the run's stream is open: it follows live
    step_id = (await submit(client, run_id, max_tokens=TOKENS)).json()["step_id"]
    events = await read_stream(client, f"/v1/steps/{step_id}/stream")
    run_events = await asyncio.wait_for(run_follower, 10)

    assert lost, "no writer round held tokens"
    step = await wait_status(client, step_id, "succeeded", "failed")
    assert step["status"] == "succeeded", step.get("error")
    assert not orch.writer.failed_steps
    assert [e.event for e in events][-1] == "end"
    assert [int(e.id or -1) for e in events] == list(range(TOKENS + 3))
    assert [e.data["i"] for e in events if e.event == "token" and e.data] == list(range(TOKENS))

    stored = await stored_events(orch.db, step_id=step_id)
    assert [ev.seq for ev in stored] == list(range(TOKENS + 3))
    in_run = await stored_events(orch.db, run_id=run_id)
    assert [ev.run_seq for ev in in_run] == list(range(len(in_run)))
    # the run's live stream: each event once, at the cursor the log holds it at
    by_cursor = {ev.run_seq: (ev.step_id, ev.seq) for ev in in_run}
    followed = [
        (int(e.id or -1), e.data["seq"])
        for e in run_events
        if e.data is not None and e.data.get("step_id") == step_id
    ]
    assert [seq for _, seq in followed] == list(range(TOKENS + 3))
    for cursor, seq in followed:
        assert by_cursor[cursor] == (step_id, seq)
    assert _handed_on(caplog, run_id) == [(ev.run_seq, ev.type) for ev in in_run]


async def _follow_run(client: httpx.AsyncClient, run_id: str, following: asyncio.Event) -> Any:
    """The run's stream to its ``run_end``; ``following`` set at its first event."""
    got: list[Any] = []
    async with client.stream("GET", f"/v1/runs/{run_id}/stream") as r:
        buf = ""
        async for chunk in r.aiter_text():
            buf += chunk
            got = parse_sse(buf[: buf.rfind("\n\n") + 2])[0]
            if got:
                following.set()
    return got


@pytest.mark.parametrize("after_commit", [True, False], ids=["after-commit", "before-commit"])
async def test_a_lost_round_that_ended_its_run_hands_on_the_run_end(
    live: httpx.AsyncClient,
    orch: Orchestrator,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    after_commit: bool,
) -> None:
    """The round lost is a step's end whose settlement ended its run (the run was completed
    while the step ran): the run ends once, and its live followers get the step's ``end``
    and the ``run_end`` once each, at their stored cursors."""
    caplog.set_level(logging.DEBUG, logger="orchestratord.events")
    lost = _lose_once(monkeypatch, after_commit=after_commit, holding="end")
    run_id, step_id = await sleeping_step(live)
    following = asyncio.Event()
    follower = asyncio.create_task(_follow_run(live, run_id, following))
    await asyncio.wait_for(following.wait(), 10)  # it has read the log: it follows live now
    assert (await live.post(f"/v1/runs/{run_id}/complete", json={"status": "failed"})).json()[
        "ended_at"
    ] is None  # its step is live
    await live.post(f"/v1/steps/{step_id}/cancel")
    events = await asyncio.wait_for(follower, 10)

    assert lost, "no writer round held the step's end"
    assert (await wait_status(live, step_id, "cancelled", "failed"))["status"] == "cancelled"
    assert not orch.writer.failed_steps
    run = (await live.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "failed" and run["ended_at"] is not None
    in_run = await stored_events(orch.db, run_id=run_id)
    assert [ev.run_seq for ev in in_run] == list(range(len(in_run)))
    assert [ev.type for ev in in_run].count("run_end") == 1
    assert [e.event for e in events][-2:] == ["end", "run_end"]
    assert [int(e.id or -1) for e in events] == [ev.run_seq for ev in in_run]
    # handed on once each, the run_end too (its engine sessions are closed on it)
    assert _handed_on(caplog, run_id) == [(ev.run_seq, ev.type) for ev in in_run]


async def test_events_wait_for_a_database_that_is_unavailable(
    client: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down for more rounds than the writer's retries (a restart, a failover): the commits
    wait for it instead of giving the step up, and the step ends succeeded with every event
    once. (More failures than ``retries`` of any other kind lose the step's events.)"""
    from orchestrator_core.errors import DatabaseUnavailable

    real = EventWriter._transaction
    refused: list[int] = []

    async def down_for_a_while(self: EventWriter, batch: Any) -> Any:
        if any(ev.type == "token" for ev in batch.events) and len(refused) < 5:
            refused.append(len(batch.events))
            raise DatabaseUnavailable("connection refused")
        return await real(self, batch)

    monkeypatch.setattr(EventWriter, "_transaction", down_for_a_while)
    run_id = await make_run(client)
    step_id = (await submit(client, run_id, max_tokens=TOKENS)).json()["step_id"]
    step = await wait_status(client, step_id, "succeeded", "failed")
    assert len(refused) == 5 > orch.writer._retries
    assert step["status"] == "succeeded", step.get("error")
    assert not orch.writer.failed_steps
    stored = await stored_events(orch.db, step_id=step_id)
    assert [ev.seq for ev in stored] == list(range(TOKENS + 3))
