"""Properties of resuming a stream at a cursor (``Last-Event-ID`` or ``after``): for any log
and any cursor, the stream sends exactly the events after it, in order, once each; and the
cursor parser takes the ids the server writes and refuses anything else."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.bounds import MAX_INT
from orchestrator_core.errors import InvalidParams
from orchestratord.api.app import create_app
from orchestratord.eventlog import RUN_END, LogEvent
from orchestratord.runtime import Orchestrator
from orchestratord.streams.hub import Hub
from orchestratord.streams.routes import resume_from
from orchestratord.streams.sse import KEEPALIVE, _follow, encode_frames
from tests.conftest import make_settings
from tests.helpers import make_run, parse_sse, submit, wait_status

HEADER = "header.Last-Event-ID"
cursors = st.integers(min_value=-1, max_value=MAX_INT)
blank = st.text(alphabet=" \t", max_size=2)


# --- parsing ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(cursors, blank, blank, st.none() | cursors)
def test_an_event_id_resumes_one_past_it(last: int, lead: str, trail: str, after: Any) -> None:
    assert resume_from(f"{lead}{last}{trail}", after) == last + 1  # the header wins


@settings(max_examples=100, deadline=None)
@given(st.none() | blank, st.none() | cursors)
def test_without_an_id_the_after_query_or_the_start(header: str | None, after: Any) -> None:
    assert resume_from(header, after) == (0 if after is None else after + 1)


def _accepts(text: str) -> bool:
    """The ids the server writes: ASCII decimal integers in range (whitespace around)."""
    stripped = text.strip()
    if re.fullmatch(r"-?[0-9]+", stripped) is None:
        return False
    try:
        value = int(stripped)
    except ValueError:  # past int()'s digit limit: no id the server wrote
        return False
    return -1 <= value <= MAX_INT


not_quite_ids = (
    st.text(max_size=12)
    | st.from_regex(r"[ +\-]?[0-9_]{1,20}[ .]?", fullmatch=True)
    | st.integers().map(str)
    | st.integers(min_value=4301, max_value=4400).map("7".__mul__)  # past int()'s digit limit
    # other digits int() takes, and numbers that are no ids
    | st.sampled_from(["\u0661\u0662", "\uff11", "0x1f", "1e3", "1.0", "∞", "NaN"])
)


@settings(max_examples=200, deadline=None)
@given(not_quite_ids.filter(lambda t: t.strip() != ""))
def test_only_decimal_ids_in_range_are_taken(text: str) -> None:
    if _accepts(text):
        assert resume_from(text, None) == int(text.strip()) + 1
        return
    with pytest.raises(InvalidParams) as info:
        resume_from(text, None)
    assert info.value.field == HEADER


# --- the follower, against a log that grows while it reads ------------------------------------


def _event(i: int, n: int, *, run: bool) -> LogEvent:
    if run:  # a run's log: events of several steps, then run_end
        etype = RUN_END if i == n - 1 else ("started", "token", "end")[i % 3]
        return LogEvent("r", None if etype == RUN_END else f"s{i // 3}", None, etype, b"{}", i)
    etype = "started" if i == 0 else "end" if i == n - 1 else "token"
    return LogEvent("r", "s", i, etype, orjson.dumps({"seq": i, "type": etype}), i)


@st.composite
def schedules(draw: st.DrawFn) -> dict[str, Any]:
    """A log of ``n`` events, a resume cursor, and how the log is committed around it."""
    n = draw(st.integers(min_value=2, max_value=24))
    before = draw(st.integers(min_value=0, max_value=n))  # committed before the stream opens
    chunks, left = [], n - before
    while left:
        size = draw(st.integers(min_value=1, max_value=left))
        # how the commit reaches the hub: published here, or a poke from another process
        how = draw(st.sampled_from(["publish", "poke"]))
        chunks.append((size, how, draw(st.integers(min_value=0, max_value=3))))
        left -= size
    return {
        "n": n,
        "last_id": draw(st.integers(min_value=-1, max_value=n - 1)),
        "before": before,
        "chunks": chunks,
        "buffer": draw(st.integers(min_value=1, max_value=8)),
        "batch": draw(st.integers(min_value=1, max_value=6)),
        "run": draw(st.booleans()),
    }


async def _resume(plan: dict[str, Any]) -> list[int]:
    n, run = plan["n"], plan["run"]
    log = [_event(i, n, run=run) for i in range(n)]
    committed = plan["before"]
    hub = Hub(buffer_events=plan["buffer"])
    channel = hub.subscribe_run("r") if run else hub.subscribe_step("s")

    def cursor(ev: LogEvent) -> int:
        return ev.run_seq if run else (ev.seq or 0)

    async def read(at: int, limit: int) -> list[LogEvent]:
        return [ev for ev in log[:committed] if cursor(ev) >= at][:limit]

    async def ended_before(at: int) -> bool:
        done = RUN_END if run else "end"
        return any(ev.type == done and cursor(ev) < at for ev in log[:committed])

    async def writer() -> None:
        nonlocal committed
        for size, how, yields in plan["chunks"]:
            for _ in range(yields):
                await asyncio.sleep(0)
            chunk = log[committed : committed + size]
            committed += size
            if how == "publish":
                hub.publish(chunk)
            else:
                hub.poke([("r:r" if run else "s:s")])

    async def follower() -> list[int]:
        frames = _follow(
            lambda: channel,
            read,
            resume_from(str(plan["last_id"]), None),
            run_cursor=run,
            batch=plan["batch"],
            poll_s=3600.0,  # only commits wake it: a lost wake-up hangs, and fails below
            keepalive_s=3600.0,
            on_close=lambda _channel, _ended: None,
            encode=partial(encode_frames, run_cursor=run),
            keepalive=KEEPALIVE,
            ended_before=ended_before,
        )
        text = b"".join([chunk async for chunk in frames]).decode()
        return [int(e.id or "") for e in parse_sse(text)[0]]

    ids, _ = await asyncio.wait_for(asyncio.gather(follower(), writer()), timeout=5)
    return ids


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_a_resumed_follower_sends_exactly_the_events_after_its_cursor(
    plan: dict[str, Any],
) -> None:
    ids = asyncio.run(_resume(plan))
    assert ids == list(range(plan["last_id"] + 1, plan["n"]))


# --- the same through HTTP, over a log as the server stores it ---------------------------------


@pytest.fixture
async def finished(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """A completed run of two steps, read back in small batches (coalesced token rows are
    split across reads)."""
    settings = make_settings(f"sqlite:///{tmp_path / 'o.db'}", stream={"read_batch": 2})
    orch = Orchestrator(settings)
    await orch.start()
    transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            run_id = await make_run(client)
            steps = []
            for token, max_tokens in (("a", 11), ("b", 5)):
                step_id = (await submit(client, run_id, token, max_tokens=max_tokens)).json()[
                    "step_id"
                ]
                await wait_status(client, step_id, "succeeded")
                steps.append(step_id)
            r = await client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
            assert r.status_code == 200, r.text
            yield {"client": client, "run": f"/v1/runs/{run_id}/stream", "step": steps[0]}
    finally:
        await orch.stop()


async def _ids(client: httpx.AsyncClient, path: str, **kw: Any) -> list[int]:
    r = await client.get(path, **kw)
    assert r.status_code == 200, r.text
    return [int(e.id or "") for e in parse_sse(r.text)[0]]


HTTP = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@HTTP
@given(which=st.sampled_from(["step", "run"]), data=st.data())
async def test_resuming_over_http_sends_the_rest_of_the_log(
    finished: dict[str, Any], which: str, data: st.DataObject
) -> None:
    client = finished["client"]
    path = finished["run"] if which == "run" else f"/v1/steps/{finished['step']}/stream"
    full = await _ids(client, path)
    assert full == list(range(len(full)))
    last = data.draw(st.integers(min_value=-1, max_value=len(full) + 2), label="last")
    by = data.draw(st.sampled_from(["header", "after"]), label="by")
    if by == "header":
        resumed = await _ids(client, path, headers={"Last-Event-ID": str(last)})
    else:
        resumed = await _ids(client, path, params={"after": last})
    assert resumed == full[last + 1 :]


@HTTP
@given(
    header=not_quite_ids.filter(lambda t: t.strip() != "" and t.isascii() and t.isprintable()),
    after=st.integers(max_value=-2) | st.integers(min_value=MAX_INT + 1),
)
async def test_http_refuses_cursors_it_never_wrote(
    finished: dict[str, Any], header: str, after: int
) -> None:
    client, path = finished["client"], finished["run"]
    r = await client.get(path, params={"after": after})
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "query.after"
    if not _accepts(header):
        r = await client.get(path, headers={"Last-Event-ID": header})
        assert r.status_code == 422
        assert r.json()["details"]["errors"][0]["field"] == HEADER
