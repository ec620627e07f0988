from __future__ import annotations

from typing import Any

import httpx
import sqlalchemy as sa

from orchestratord.api.app import create_app
from orchestratord.db.models import Step
from orchestratord.runtime import Orchestrator
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import (
    DispatcherWake,
    dispatcher_idle,
    make_run,
    parse_sse,
    read_stream,
    submit,
    tokens_published,
    wait_status,
)
from worker_adapters.sim import SimAdapter


def _slow(orch: Orchestrator, rate: float = 40.0, slots: int | None = None) -> SimAdapter:
    replica = orch.pools.pools["local"].replicas[0]
    adapter = replica.adapter
    assert isinstance(adapter, SimAdapter)
    adapter.tokens_per_s = rate
    if slots is not None:
        replica.slots = slots
    return adapter


async def test_cancel_running_step(live: httpx.AsyncClient, orch: Orchestrator) -> None:
    adapter = _slow(orch)
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=1000)).json()["step_id"]
    async with live.stream("GET", f"/v1/steps/{step_id}/stream") as r:
        buf = ""
        cancelled = False
        async for chunk in r.aiter_text():
            buf += chunk
            if not cancelled and buf.count("event: token") >= 3:
                resp = await live.post(f"/v1/steps/{step_id}/cancel")
                assert resp.status_code == 202
                assert resp.json()["status"] in ("cancelling", "cancelled")
                cancelled = True
    events, _ = parse_sse(buf)
    assert events[-1].event == "end"
    assert events[-1].data and events[-1].data["stop_reason"] == "cancelled"
    assert all(e.event != "token" for e in events[events.index(events[-1]) :][1:])
    step = await wait_status(live, step_id, "cancelled")
    n_tokens = sum(1 for e in events if e.event == "token")
    assert step["usage"]["tokens_out"] == n_tokens < 1000
    assert step_id not in adapter.active_requests  # the engine request was aborted
    # cancelling again reports the terminal status
    again = await live.post(f"/v1/steps/{step_id}/cancel")
    assert again.json()["status"] == "cancelled"


async def test_cancel_before_start(live: httpx.AsyncClient, orch: Orchestrator) -> None:
    _slow(orch, rate=20.0, slots=1)
    run_id = await make_run(live)
    busy = (await submit(live, run_id, token="busy", max_tokens=1000)).json()["step_id"]
    queued = (await submit(live, run_id, token="queued", max_tokens=10)).json()["step_id"]
    assert (await live.get(f"/v1/steps/{queued}")).json()["status"] == "queued"
    r = await live.post(f"/v1/steps/{queued}/cancel")
    assert r.status_code == 202
    assert r.json()["status"] == "cancelled"
    events = await read_stream(live, f"/v1/steps/{queued}/stream")
    assert [e.event for e in events] == ["started", "end"]
    assert events[1].data and events[1].data["stop_reason"] == "cancelled"
    await live.post(f"/v1/steps/{busy}/cancel")
    await wait_status(live, busy, "cancelled")
    # the cancelled queued step never ran
    step = (await live.get(f"/v1/steps/{queued}")).json()
    assert step["started_at"] is None and step["usage"]["tokens_out"] == 0


async def test_cancel_run(live: httpx.AsyncClient, orch: Orchestrator) -> None:
    _slow(orch, rate=20.0, slots=2)
    run_id = await make_run(live)
    ids = [
        (await submit(live, run_id, token=f"s{i}", max_tokens=1000)).json()["step_id"]
        for i in range(4)
    ]
    for sid in ids[:2]:
        await wait_status(live, sid, "running")
    r = await live.post(f"/v1/runs/{run_id}/cancel")
    assert r.status_code == 202
    assert r.json()["status"] in ("cancelling", "cancelled")
    for sid in ids:
        step = await wait_status(live, sid, "cancelled")
        assert step["status"] == "cancelled"
    # the run's stream ends with the run (its end and its status commit together)
    ended = await read_stream(live, f"/v1/runs/{run_id}/stream")
    assert ended[-1].event == "run_end"
    run = (await live.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "cancelled"
    refused = await submit(live, run_id, token="late")
    assert refused.status_code == 409
    assert refused.json()["code"] == "RUN_ENDED"
    again = await live.post(f"/v1/runs/{run_id}/cancel")
    assert again.json()["status"] == "cancelled"


class _Peak(set[str]):
    """An engine's requests in flight, and the most there were at once."""

    peak = 0

    def add(self, element: str) -> None:
        super().add(element)
        self.peak = max(self.peak, len(self))


async def test_replica_never_exceeds_its_slots(live: httpx.AsyncClient, orch: Orchestrator) -> None:
    adapter = _slow(orch, rate=200.0, slots=3)
    adapter._active = active = _Peak()  # every engine request counted as it comes
    run_id = await make_run(live)
    ids = [
        (await submit(live, run_id, token=f"t{i}", max_tokens=20)).json()["step_id"]
        for i in range(9)
    ]
    pools = (await live.get("/v1/pools")).json()
    assert pools[0]["load"]["slots_busy"] <= 3
    for sid in ids:
        await wait_status(live, sid, "succeeded")
    assert 1 <= active.peak <= 3


async def _running_step(orch: Orchestrator, live: httpx.AsyncClient) -> str:
    _slow(orch, rate=20.0)
    run_id = await make_run(live)
    step_id: str = (await submit(live, run_id, max_tokens=1000)).json()["step_id"]
    await tokens_published(orch, step_id, 1)  # running, and generating
    return step_id


async def _request_cancel_as_another_process(orch: Orchestrator, step_id: str) -> None:
    """What a cancel through another process leaves here: the flag, and no call."""
    async with orch.db.write() as session:
        await session.execute(
            sa.update(Step).where(Step.step_id == step_id).values(cancel_requested=True)
        )


async def test_a_cancel_made_through_another_process_is_picked_up(
    live: httpx.AsyncClient, orch: Orchestrator
) -> None:
    step_id = await _running_step(orch, live)
    await _request_cancel_as_another_process(orch, step_id)
    step = await wait_status(live, step_id, "cancelled")  # within the dispatcher's poll_s
    assert 0 < step["usage"]["tokens_out"] < 1000


async def test_wakes_do_not_each_look_for_cancels(db_url: str) -> None:
    """Under load a wake comes with every submission and every ended step; the look for
    other processes' cancels is a read each time, so it runs once per poll_s, not per wake."""
    orch = Orchestrator(make_settings(db_url, dispatch={"poll_s": 60.0}))
    orch.dispatcher._wake = DispatcherWake()
    await orch.start()
    looks = 0

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        nonlocal looks
        looks += statement.startswith("SELECT steps.step_id") and "cancel_requested IS" in statement

    try:
        async with (
            serve_app(create_app(orchestrator=orch)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as live,
        ):
            step_id = await _running_step(orch, live)
            sa.event.listen(orch.db.engine.sync_engine, "before_cursor_execute", count)
            for _ in range(50):
                orch.dispatcher.wake()
                await dispatcher_idle(orch)  # its round, and its look for cancels if due
            sa.event.remove(orch.db.engine.sync_engine, "before_cursor_execute", count)
            assert looks <= 1
            # a cancel through this process still reaches the step at once
            assert (await live.post(f"/v1/steps/{step_id}/cancel")).status_code == 202
            await wait_status(live, step_id, "cancelled")
    finally:
        await orch.stop()
