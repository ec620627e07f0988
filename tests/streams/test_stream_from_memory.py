"""A stream of a step submitted or run by this process is served from memory: the hub holds
every event of it since its first (its channel is *whole*), so opening and following the
stream reads nothing from the database, and a stream resumed past its end ends at once.
Where the hub may miss writes (another process's, without a wake-up), streams read the log."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import Request
from pydantic import TypeAdapter
from sqlalchemy import event

from contracts.steps import StepCreate
from orchestratord.api.app import create_app
from orchestratord.db import prepared
from orchestratord.eventlog import LogEvent, make_event
from orchestratord.runtime import Orchestrator
from orchestratord.steps import routes
from orchestratord.streams.hub import Hub
from tests.helpers import make_run, read_stream, submit, wait_status


class Reads:
    """Statements that read a step's events or its row for a stream."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, _c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        text = " ".join(statement.split())
        if text.startswith(("SELECT events.", "SELECT steps.cancel_on_disconnect")):
            self.seen.append(text[:80])


@pytest.fixture
def reads(orch: Orchestrator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    counter = Reads()
    engine = orch.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", counter)
    # the log's pages are read on the driver itself (``Prepared``), past SQLAlchemy's events
    on_driver, on_asyncpg = prepared.run_on_driver, prepared.run_on_asyncpg

    def driver(conn: Any, sql: str, *args: Any, **kw: Any) -> Any:
        counter(None, None, sql)
        return on_driver(conn, sql, *args, **kw)

    async def asyncpg(adapted: Any, conn: Any, sql: str, *args: Any, **kw: Any) -> Any:
        counter(None, None, sql)
        return await on_asyncpg(adapted, conn, sql, *args, **kw)

    monkeypatch.setattr(prepared, "run_on_driver", driver)
    monkeypatch.setattr(prepared, "run_on_asyncpg", asyncpg)
    try:
        yield counter
    finally:
        event.remove(engine, "before_cursor_execute", counter)


async def test_a_step_submitted_here_streams_without_reading_the_log(
    orch: Orchestrator, live: httpx.AsyncClient, reads: Reads
) -> None:
    run_id = await make_run(live)
    for i in range(5):
        step_id = (await submit(live, run_id, token=f"t{i}", max_tokens=3)).json()["step_id"]
        events = await read_stream(live, f"/v1/steps/{step_id}/stream")
        kinds = ["started", "narration", "token", "token", "token", "end"]
        assert [e.event for e in events] == kinds
        assert [e.id for e in events] == ["0", "1", "2", "3", "4", "5"]
    assert reads.seen == []


async def test_an_ended_step_streams_from_memory_and_a_resume_past_its_end_ends(
    orch: Orchestrator, live: httpx.AsyncClient, reads: Reads
) -> None:
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=2)).json()["step_id"]
    await wait_status(live, step_id, "succeeded")
    events = await read_stream(live, f"/v1/steps/{step_id}/stream")
    assert [e.id for e in events] == ["0", "1", "2", "3", "4"]
    resumed = await read_stream(live, f"/v1/steps/{step_id}/stream", {"Last-Event-ID": "2"})
    assert [e.id for e in resumed] == ["3", "4"]
    assert await read_stream(live, f"/v1/steps/{step_id}/stream", {"Last-Event-ID": "4"}) == []
    assert reads.seen == []


async def test_a_long_step_that_ended_before_its_stream_opened_streams_from_memory(
    orch: Orchestrator, live: httpx.AsyncClient, reads: Reads
) -> None:
    """As a burst's last client opens its stream after its step's 200 tokens: served from
    memory like a short one (the log read is round trips to PostgreSQL at the worst time)."""
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=200)).json()["step_id"]
    await wait_status(live, step_id, "succeeded")
    events = await read_stream(live, f"/v1/steps/{step_id}/stream")
    assert [e.event for e in events] == ["started", "narration", *["token"] * 200, "end"]
    assert [e.id for e in events] == [str(i) for i in range(203)]
    assert reads.seen == []


async def test_a_step_the_hub_no_longer_holds_is_read_from_the_log(
    orch: Orchestrator, live: httpx.AsyncClient, reads: Reads
) -> None:
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=2)).json()["step_id"]
    await wait_status(live, step_id, "succeeded")
    orch.hub.forget_step(step_id)
    assert orch.hub.known_step(step_id) is None
    events = await read_stream(live, f"/v1/steps/{step_id}/stream")
    assert [e.id for e in events] == ["0", "1", "2", "3", "4"]
    assert any(s.startswith("SELECT steps.") for s in reads.seen)  # the row was read
    assert any(s.startswith("SELECT events.") for s in reads.seen)  # and the log
    missing = await live.get("/v1/steps/step_nope/stream")
    assert missing.status_code == 404


def _ev(step_id: str, seq: int, etype: str = "token") -> LogEvent:
    ev = make_event("run_1", step_id, seq, etype, {})
    ev.run_seq = seq
    return ev


def test_a_held_channel_is_whole_until_another_process_writes_to_it() -> None:
    hub = Hub()
    chan = hub.hold_step("s", cancel_on_disconnect=True, whole=True)
    assert hub.known_step("s") is chan and chan.take(0, 10) == []
    hub.publish([_ev("s", 0, "started"), _ev("s", 1)])
    hub.poke(["s:s"])  # a foreign write: the log holds what the tail never saw
    assert hub.known_step("s") is None
    hub.release_step("s")
    assert hub.open_streams() == 0


def test_a_step_run_again_is_not_whole() -> None:
    hub = Hub()
    hub.hold_step("s", cancel_on_disconnect=False, whole=False)
    assert hub.known_step("s") is None


def test_a_channel_followed_before_its_step_ran_is_whole_only_if_nothing_reached_it() -> None:
    hub = Hub()
    hub.subscribe_step("a")
    assert hub.hold_step("a", cancel_on_disconnect=False, whole=True).whole
    hub.subscribe_step("b")
    hub.publish([_ev("b", 0, "started")])  # published before the hold: not from the start
    assert not hub.hold_step("b", cancel_on_disconnect=False, whole=True).whole


def _ended(hub: Hub, step_id: str, events: int) -> None:
    hub.hold_step(step_id, cancel_on_disconnect=False, whole=True)
    hub.publish([_ev(step_id, i) for i in range(events - 1)] + [_ev(step_id, events - 1, "end")])
    hub.release_step(step_id)


def _known(hub: Hub, *step_ids: str) -> list[str]:
    return [s for s in step_ids if hub.known_step(s)]


def test_ended_channels_are_retained_within_bounds() -> None:
    steps = ("s0", "s1", "s2", "s3", "s4")
    by_count = Hub(retain_steps=3, retain_events=100)  # the last 3 ended steps
    for sid in steps:
        _ended(by_count, sid, 2)
    assert _known(by_count, *steps) == ["s2", "s3", "s4"]
    chan = by_count.known_step("s4")
    assert chan is not None and chan.ended_before(2) and not chan.ended_before(1)
    by_events = Hub(retain_steps=10, retain_events=5)  # the last ones holding 5 events in all
    for sid in steps:
        _ended(by_events, sid, 2)
    assert _known(by_events, *steps) == ["s3", "s4"]
    # a step holding more than the whole budget is not kept, and evicts nothing
    _ended(by_events, "long", 6)
    assert _known(by_events, "long", "s3", "s4") == ["s3", "s4"]
    # a step held again leaves the budget: its events no longer count
    by_events.hold_step("s3", cancel_on_disconnect=False, whole=True)
    _ended(by_events, "s5", 3)
    assert _known(by_events, "s4", "s5") == ["s4", "s5"]
    # a step longer than a channel's tail (its first events dropped) is not kept
    short_tail = Hub(buffer_events=8)
    _ended(short_tail, "over", 9)
    _ended(short_tail, "fits", 7)
    assert _known(short_tail, "over", "fits") == ["fits"]
    # a step let go (another process goes on with it) is not kept either
    by_events.hold_step("gone", cancel_on_disconnect=False, whole=True)
    by_events.release_step("gone", keep=False)
    assert by_events.known_step("gone") is None


def test_a_retained_channel_followed_when_evicted_lives_while_followed() -> None:
    hub = Hub(retain_steps=1)
    hub.expect_step("a", cancel_on_disconnect=True)
    chan = hub.subscribe_step("a")
    hub.expect_step("b", cancel_on_disconnect=True)  # evicts "a" from the retained
    hub.publish([_ev("a", 0, "started")])
    assert chan.take(0, 10) is not None and hub.followers("a") == 1
    assert hub.unsubscribe_step("a") == 0
    assert hub.known_step("a") is None and hub.open_streams() == 0


async def test_a_submission_that_fails_leaves_no_expected_channel(
    orch: Orchestrator, live: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected: list[str] = []
    expect = orch.hub.expect_step

    def expect_then_fail(step_id: str, **kw: Any) -> None:
        expected.append(step_id)
        expect(step_id, **kw)
        raise RuntimeError("the submission did not commit")

    monkeypatch.setattr(orch.hub, "expect_step", expect_then_fail)
    body = TypeAdapter(StepCreate).validate_python(
        {"type": "llm_call", "client_token": "t", "input": {"prompt": "p"}}
    )
    run_id = await make_run(live)
    with pytest.raises(RuntimeError):
        request = Request({"type": "http", "app": create_app(orchestrator=orch), "headers": []})
        await routes.submit_step(run_id, body, request, accept=None, principal=None)
    assert expected and orch.hub.known_step(expected[0]) is None
    r = await live.get(f"/v1/runs/{run_id}/steps")
    assert r.status_code == 200 and r.json() == []  # rolled back: nothing stored
