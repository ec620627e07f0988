"""SSE over a real socket: order, resume, headers, keep-alive, slow readers, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from orchestratord.api.app import create_app
from orchestratord.eventlog import LogEvent, read_run_events
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import (
    SseEvent,
    StreamsWatch,
    make_run,
    parse_sse,
    read_run_stream,
    read_stream,
    submit,
    wait_status,
    when_called,
)

BODY = {"token", "tool_suggest", "fact", "metrics", "narration"}


def assert_grammar(events: list[SseEvent]) -> None:
    types = [e.event for e in events]
    assert types[0] == "started"
    assert types[-1] in ("end", "error")
    assert all(t in BODY for t in types[1:-1]), types
    for i, e in enumerate(events):
        assert e.id == str(i)
        assert e.data is not None
        assert e.data["seq"] == i and e.data["type"] == e.event and e.data["step_id"]


async def test_live_stream_order_and_headers(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=64)).json()["step_id"]
    async with live.stream(
        "GET", f"/v1/steps/{step_id}/stream", headers={"X-Correlation-Id": "abc-1"}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"
        assert r.headers["x-correlation-id"] == "abc-1"
        text = "".join([chunk async for chunk in r.aiter_text()])
    events, _ = parse_sse(text)
    assert_grammar(events)
    tokens = [e.data for e in events if e.event == "token" and e.data]
    assert [t["i"] for t in tokens] == list(range(64))
    assert events[-1].data and events[-1].data["tokens_out"] == 64


@pytest.mark.parametrize("last_id", [0, 5, 30, 65])
async def test_last_event_id_resumes_exactly(live: httpx.AsyncClient, last_id: int) -> None:
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=64)).json()["step_id"]
    full = await read_stream(live, f"/v1/steps/{step_id}/stream")
    resumed = await read_stream(
        live, f"/v1/steps/{step_id}/stream", headers={"Last-Event-ID": str(last_id)}
    )
    assert [e.id for e in resumed] == [e.id for e in full[last_id + 1 :]]
    assert [e.data for e in resumed] == [e.data for e in full[last_id + 1 :]]


async def test_bad_last_event_id(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    step_id = (await submit(live, run_id)).json()["step_id"]
    r = await live.get(f"/v1/steps/{step_id}/stream", headers={"Last-Event-ID": "abc"})
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "header.Last-Event-ID"
    # the after query takes the same ids, no looser spelling of them
    for after in ("+1", "1_0", "\u0661", " 1"):
        r = await live.get(f"/v1/steps/{step_id}/stream", params={"after": after})
        assert r.status_code == 422, (after, r.text)
        assert r.json()["details"]["errors"][0]["field"] == "query.after"


async def test_resume_mid_flight_has_no_gap_or_duplicate(db_url: str) -> None:
    """Disconnect while the step is still producing, reconnect with Last-Event-ID."""
    settings = make_settings(db_url, sim={"tokens_per_s": 400.0})
    async with _serve(settings) as client:
        run_id = await make_run(client)
        step_id = (await submit(client, run_id, max_tokens=120)).json()["step_id"]
        seen: list[SseEvent] = []
        async with client.stream("GET", f"/v1/steps/{step_id}/stream") as r:
            buf = ""
            async for chunk in r.aiter_text():
                buf += chunk
                if buf.count("event: token") >= 10:
                    break
        events, _ = parse_sse(buf.rsplit("\n\n", 1)[0] + "\n\n")
        seen.extend(events)
        rest = await read_stream(
            client, f"/v1/steps/{step_id}/stream", headers={"Last-Event-ID": seen[-1].id or ""}
        )
        merged = seen + rest
        assert_grammar(merged)
        assert merged[-1].data and merged[-1].data["tokens_out"] == 120


async def test_keepalive_comment(db_url: str) -> None:
    settings = make_settings(db_url, sim={"tokens_per_s": 2.0}, stream={"keepalive_s": 0.2})
    async with _serve(settings) as client:
        run_id = await make_run(client)
        step_id = (await submit(client, run_id, max_tokens=3)).json()["step_id"]
        r = await client.get(f"/v1/steps/{step_id}/stream")
    events, comments = parse_sse(r.text)
    assert "keep-alive" in comments
    assert_grammar(events)


async def test_slow_reader_loses_nothing(db_url: str) -> None:
    """A reader that falls behind the in-memory tail reads the rest from the log."""
    settings = make_settings(db_url, stream={"buffer_events": 16, "read_batch": 7})
    async with _serve(settings) as client:
        run_id = await make_run(client)
        step_id = (await submit(client, run_id, max_tokens=400)).json()["step_id"]
        events: list[SseEvent] = []
        async with client.stream("GET", f"/v1/steps/{step_id}/stream") as r:
            buf = ""
            async for chunk in r.aiter_text():
                buf += chunk
                await asyncio.sleep(0.001)  # slower than the engine
        events, _ = parse_sse(buf)
    assert_grammar(events)
    assert sum(1 for e in events if e.event == "token") == 400


async def test_disconnect_releases_the_follower(
    live: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    orch.pools.pools["local"].replicas[0].adapter.tokens_per_s = 50.0  # type: ignore[attr-defined]
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=200)).json()["step_id"]
    left = when_called(orch.hub, "unsubscribe_step", monkeypatch, lambda s: s == step_id)
    async with live.stream("GET", f"/v1/steps/{step_id}/stream") as r:
        async for _chunk in r.aiter_bytes():
            break
    await asyncio.wait_for(left.wait(), 10)  # the server saw the client go
    assert orch.hub.followers(step_id) == 0
    # the default does not cancel on disconnect: the step still runs to its end
    step = (await live.get(f"/v1/steps/{step_id}")).json()
    assert step["status"] == "running"
    await live.post(f"/v1/steps/{step_id}/cancel")


async def test_cancel_on_disconnect(live: httpx.AsyncClient, orch: Orchestrator) -> None:
    orch.pools.pools["local"].replicas[0].adapter.tokens_per_s = 50.0  # type: ignore[attr-defined]
    run_id = await make_run(live, cancel_on_disconnect=True)
    step_id = (await submit(live, run_id, max_tokens=500)).json()["step_id"]
    async with live.stream("GET", f"/v1/steps/{step_id}/stream") as r:
        async for chunk in r.aiter_text():
            if "event: token" in chunk:
                break
    step = await wait_status(live, step_id, "cancelled")
    assert step["output"]["stop_reason"] == "cancelled"
    events = await read_stream(live, f"/v1/steps/{step_id}/stream")
    assert_grammar(events)
    assert events[-1].data and events[-1].data["stop_reason"] == "cancelled"


async def test_many_followers_of_one_step(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    step_id = (await submit(live, run_id, max_tokens=100)).json()["step_id"]
    streams = await asyncio.gather(
        *(read_stream(live, f"/v1/steps/{step_id}/stream") for _ in range(10))
    )
    first = [(e.id, e.data) for e in streams[0]]
    assert all([(e.id, e.data) for e in s] == first for s in streams)


async def test_run_stream_carries_steps_and_facts(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    a = (await submit(live, run_id, token="a", max_tokens=5)).json()["step_id"]
    await wait_status(live, a, "succeeded")
    await live.post(f"/v1/runs/{run_id}/facts", json={"type": "note", "data": {"x": 1}})
    b = (await submit(live, run_id, token="b", max_tokens=5)).json()["step_id"]
    await wait_status(live, b, "succeeded")
    expected = 8 + 1 + 8  # each step: started, where it was placed, 5 tokens, end
    got = await read_run_stream(live, run_id, expected)
    assert [e.id for e in got] == [str(i) for i in range(expected)]
    assert [e.event for e in got][8] == "fact"
    assert got[8].data and got[8].data["data"] == {"x": 1}
    assert {e.data["step_id"] for e in got if e.data and e.event != "fact"} == {a, b}
    # resume the run stream after cursor 8
    async with live.stream("GET", f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": "8"}) as r:
        buf = ""
        async for chunk in r.aiter_text():
            buf += chunk
            tail, _ = parse_sse(buf)
            if len(tail) >= 8:
                break
    assert [e.id for e in tail] == [str(i) for i in range(9, 17)]


class _serve:
    """A started Orchestrator with its own settings behind a loopback server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> httpx.AsyncClient:
        self.orch = Orchestrator(self.settings)
        await self.orch.start()
        self.stack.push_async_callback(self.orch.stop)
        url = await self.stack.enter_async_context(serve_app(create_app(orchestrator=self.orch)))
        return await self.stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.aclose()


async def test_a_queued_step_is_told_where_it_waits(db_url: str) -> None:
    settings = make_settings(db_url, sim={"slots": 1, "tokens_per_s": 50.0})
    async with _serve(settings) as live:
        run_id = await make_run(live)
        busy = (await submit(live, run_id, token="busy", max_tokens=5000)).json()["step_id"]
        await wait_status(live, busy, "running")
        queued = (await submit(live, run_id, token="q", max_tokens=3)).json()["step_id"]
        seen: list[SseEvent] = []
        async with live.stream("GET", f"/v1/steps/{queued}/stream") as r:
            buf = ""
            async for chunk in r.aiter_text():
                buf += chunk
                seen, _ = parse_sse(buf[: buf.rfind("\n\n") + 2])
                if any(e.event == "narration" for e in seen):
                    break
        (narration,) = [e for e in seen if e.event == "narration"]
        assert narration.id is None  # not stored: no cursor to resume from
        assert narration.data is not None
        assert narration.data["text"] == "waiting for a slot of pool local: position 1 in the queue"
        assert narration.data["seq"] is None and narration.data["step_id"] == queued
        await live.post(f"/v1/steps/{busy}/cancel")
        await wait_status(live, queued, "succeeded")
        events = await read_stream(live, f"/v1/steps/{queued}/stream")
        told = [e.data["text"] for e in events if e.event == "narration" and e.data]
        assert told == ["placed on local/r0: 1 candidates; chosen by auto"]  # no queue place


async def test_a_quiet_stream_of_a_step_running_here_reads_no_queue_place(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue narration looks in the database only for a step that may still wait: a
    stream whose step runs in its process goes quiet (slow tokens) without reading it."""
    from orchestratord.steps.queries import queue_narration as real
    from orchestratord.streams import sse

    looked: list[str] = []

    async def counted(session: Any, *, step_id: str) -> str | None:
        looked.append(step_id)
        return await real(session, step_id=step_id)

    monkeypatch.setattr(sse, "queue_narration", counted)
    settings = make_settings(db_url, sim={"tokens_per_s": 8.0}, stream={"poll_s": 0.02})
    async with _serve(settings) as live:
        run_id = await make_run(live)
        step_id = (await submit(live, run_id, token="slow", max_tokens=4)).json()["step_id"]
        events = await read_stream(live, f"/v1/steps/{step_id}/stream")
        assert [e.event for e in events].count("token") == 4  # quiet waits between them
    assert looked == []


async def test_long_engine_steps_report_metrics_at_most_once_a_second(db_url: str) -> None:
    settings = make_settings(db_url, sim={"tokens_per_s": 60.0})
    async with _serve(settings) as live:
        run_id = await make_run(live, budgets={"max_tokens_out": 150})
        step_id = (await submit(live, run_id, token="m", max_tokens=200)).json()["step_id"]
        step = await wait_status(live, step_id, "succeeded")
        events = await read_stream(live, f"/v1/steps/{step_id}/stream")
        kinds = [e.event for e in events]
        narration = [e.data["text"] for e in events if e.event == "narration" and e.data]
        assert narration == [
            "placed on local/r0: 1 candidates; chosen by auto",
            "max_tokens clamped from 200 to 150 by the budget",
        ]
        metrics = [e.data for e in events if e.event == "metrics" and e.data]
        seconds = step["provenance"]["decode_time_ms"] / 1000
        assert 1 <= len(metrics) <= seconds + 1
        assert all(m["tokens_out"] > 0 and m["tokens_per_s"] > 0 for m in metrics)
        assert metrics[0]["tokens_budget_remaining"] == 150 - metrics[0]["tokens_out"]
        assert kinds[0] == "started" and kinds[-1] == "end"
        tokens = [e for e in events if e.event == "token"]
        assert [t.data["i"] for t in tokens if t.data] == list(range(150))


async def test_idle_followers_read_the_log_only_when_they_cannot_be_woken(
    live: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orchestratord.streams.sse as sse

    reads: list[int] = []
    real = read_run_events

    async def counting(*args: object, **kwargs: object) -> list[LogEvent]:
        reads.append(1)
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sse, "read_run_events", counting)
    run_id = await make_run(live)
    await live.post(f"/v1/runs/{run_id}/facts", json={"type": "x", "data": 1})
    poll_s = orch.settings.stream.poll_s
    got = asyncio.Event()

    async def follow() -> None:  # stays connected: leaving would end the server's follower
        async with live.stream("GET", f"/v1/runs/{run_id}/stream") as r:
            async for chunk in r.aiter_text():
                if "event: fact" in chunk:
                    got.set()

    async def idle_reads() -> int:
        got.clear()
        task = asyncio.create_task(follow())
        await asyncio.wait_for(got.wait(), 10)
        at_start = len(reads)
        await asyncio.sleep(poll_s * 4)  # idle: four quiet waits
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return len(reads) - at_start

    # every commit that concerns it wakes it: this process's through the hub, other
    # processes' through NOTIFY (PostgreSQL)
    assert await idle_reads() == 0
    if not orch.db.is_sqlite:
        monkeypatch.setattr(orch, "wakeups", None)  # no wake-ups: it must poll the log
        assert await idle_reads() >= 2


async def test_streams_past_the_limits_are_refused_naming_the_limit(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step's open streams, and the process's, are capped: 429 LIMIT_EXCEEDED, retriable,
    naming the setting; a stream that ends frees its place."""
    settings = make_settings(
        db_url,
        sim={"tokens_per_s": 5.0},
        stream={"max_followers_per_step": 2, "max_followers": 3},
    )
    orch = Orchestrator(settings)
    await orch.start()
    streams = StreamsWatch(orch, monkeypatch)

    try:
        async with (
            serve_app(create_app(orchestrator=orch)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            run_id = await make_run(client)
            step_id = (await submit(client, run_id, max_tokens=200)).json()["step_id"]
            path = f"/v1/steps/{step_id}/stream"

            async def follow(p: str) -> None:
                async with client.stream("GET", p) as r:
                    async for _ in r.aiter_bytes():
                        pass  # a client reading on

            readers = [asyncio.create_task(follow(path)) for _ in range(2)]
            await streams.until(lambda: orch.hub.followers(step_id) == 2)
            refused = await client.get(path)
            assert refused.status_code == 429
            body = refused.json()
            assert body["code"] == "LIMIT_EXCEEDED" and body["retriable"] is True
            assert body["details"]["limit"] == "stream.max_followers_per_step"
            assert body["retry_after_ms"] > 0 and refused.headers["Retry-After"]
            readers.append(asyncio.create_task(follow(f"/v1/runs/{run_id}/stream")))
            await streams.until(lambda: orch.hub.open_streams() == 3)
            other = await client.get(f"/v1/runs/{run_id}/stream")
            assert other.status_code == 429
            assert other.json()["details"]["limit"] == "stream.max_followers"
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await streams.until(lambda: orch.hub.open_streams() == 0)  # closed streams free places
            await client.post(f"/v1/steps/{step_id}/cancel")
            again = await client.get(path)  # the step has ended: its whole log, then closed
            assert again.status_code == 200 and "event: end" in again.text
    finally:
        await orch.stop()
