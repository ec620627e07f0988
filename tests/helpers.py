"""Small clients of the API used across tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import httpx
import orjson
import pytest
from sqlalchemy import event

if TYPE_CHECKING:
    from orchestratord.runtime import Orchestrator


@asynccontextmanager
async def started_client(
    orch: Orchestrator, base_url: str = "http://test"
) -> AsyncIterator[httpx.AsyncClient]:
    """``orch`` started, and an in-process client of its app (responses are buffered: a
    stream is read whole); ``orch`` is stopped after."""
    from orchestratord.api.app import create_app

    await orch.start()
    try:
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            yield client
    finally:
        await orch.stop()


async def make_flow(client: httpx.AsyncClient, ast: Any = None, **extra: Any) -> str:
    r = await client.post("/v1/flows", json={"ast": ast if ast is not None else {"v": 1}, **extra})
    assert r.status_code in (200, 201), r.text
    flow_id: str = r.json()["flow_id"]
    return flow_id


# Engines whose capabilities do not offer ``seed``: a run given a seed may not sample there
# (docs/placement.md, "Seeds"), so their tests make runs whose seed the server draws.
SEEDLESS_ENGINES = frozenset({"salience"})


def seed_on(engine: str, seed: int) -> int | None:
    """``seed`` for a run whose steps sample on ``engine``; None (the server draws one, and
    the run is not seeded) where the engine takes no seed."""
    return None if engine in SEEDLESS_ENGINES else seed


async def make_run(client: httpx.AsyncClient, flow_id: str | None = None, **body: Any) -> str:
    if flow_id is None:
        flow_id = await make_flow(client)
    body.setdefault("seed", 42)
    r = await client.post(f"/v1/flows/{flow_id}/runs", json=body)
    assert r.status_code == 201, r.text
    run_id: str = r.json()["run_id"]
    return run_id


async def submit(
    client: httpx.AsyncClient,
    run_id: str,
    token: str = "t1",
    prompt: str = "hello",
    **params: Any,
) -> httpx.Response:
    params.setdefault("max_tokens", 16)
    return await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": token,
            "input": {"prompt": prompt, "params": params},
        },
    )


SLEEP_TOOL = {
    "name": "sleep",
    "description": "waits",
    "parameters": {"type": "object"},
    "executor": {"kind": "builtin", "name": "sleep"},
}


async def sleeping_step(client: httpx.AsyncClient) -> tuple[str, str]:
    """(run id, step id) of a new run's ``tool_call`` step that sleeps 30 s, once running."""
    run_id = await make_run(client, await make_flow(client, tools=[SLEEP_TOOL]))
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "tool_call",
            "client_token": "a",
            "input": {"tool": "sleep", "args": {"ms": 30000}},
        },
    )
    assert r.status_code in (200, 202), r.text
    step_id: str = r.json()["step_id"]
    await wait_status(client, step_id, "running")
    return run_id, step_id


@dataclass
class SseEvent:
    id: str | None
    event: str | None
    data: dict[str, Any] | None


def parse_sse(text: str) -> tuple[list[SseEvent], list[str]]:
    """(events, comment lines) of an SSE body."""
    events: list[SseEvent] = []
    comments: list[str] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                comments.append(line[1:].strip())
                continue
            key, _, value = line.partition(":")
            fields[key] = value[1:] if value.startswith(" ") else value
        if "event" in fields or "data" in fields:
            events.append(
                SseEvent(
                    fields.get("id"),
                    fields.get("event"),
                    orjson.loads(fields["data"]) if "data" in fields else None,
                )
            )
    return events, comments


async def read_stream(
    client: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None
) -> list[SseEvent]:
    r = await client.get(path, headers=headers or {})
    assert r.status_code == 200, r.text
    return parse_sse(r.text)[0]


async def until(done: Any, *, tries: int = 250, every_s: float = 0.02) -> None:
    """Wait until ``done()`` holds (checked every ``every_s``), or fail."""
    for _ in range(tries):
        if done():
            return
        await asyncio.sleep(every_s)
    raise AssertionError(f"never: {done}")


async def wait_status(client: httpx.AsyncClient, step_id: str, *wanted: str) -> dict[str, Any]:
    for _ in range(500):
        body: dict[str, Any] = (await client.get(f"/v1/steps/{step_id}")).json()
        if body["status"] in wanted:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"step {step_id} never reached {wanted}: {body['status']}")


async def read_run_stream(live: httpx.AsyncClient, run_id: str, count: int) -> list[SseEvent]:
    """The first ``count`` events of a run's stream (open until the run ends: read, leave)."""
    got: list[SseEvent] = []
    async with live.stream("GET", f"/v1/runs/{run_id}/stream") as r:
        buf = ""
        async for chunk in r.aiter_text():
            buf += chunk
            got, _ = parse_sse(buf[: buf.rfind("\n\n") + 2])  # whole events only
            if len(got) >= count:
                break
    return got


async def stored_events(
    db: Any, *, run_id: str | None = None, step_id: str | None = None
) -> list[Any]:
    """The log's events as stored, one per event (coalesced rows expanded), in cursor order."""
    import sqlalchemy as sa

    from orchestratord.db.models import Event
    from orchestratord.eventlog import EVENT_COLUMNS, expand

    stmt = sa.select(*EVENT_COLUMNS)
    if run_id is not None:
        stmt = stmt.where(Event.run_id == run_id).order_by(Event.run_seq)
    else:
        stmt = stmt.where(Event.step_id == step_id).order_by(Event.seq)
    async with db.read() as session:
        return expand((await session.execute(stmt)).all())


async def tokens_committed(db: Any, step_id: str, n: int) -> None:
    """Wait (bounded) until ``step_id`` has committed at least ``n`` token events."""
    for _ in range(500):
        events = await stored_events(db, step_id=step_id)
        if sum(1 for e in events if e.type == "token") >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"step {step_id} never committed {n} tokens")


def measured_task(name: str | None = None) -> Callable[[], bool]:
    """Whether the statement being run now is the measured work's: a test that counts
    statements counts its own task's only, since a dispatcher's look at its queue or the
    event writer's round may run between any two awaits of the work it measures.
    ``name`` None: the calling task (a request made through the ASGI transport runs in it);
    else the task of that name (``"event-writer"``, ``"dispatcher"``)."""
    if name is None:
        task = asyncio.current_task()
        assert task is not None, "called outside a task: name the task to measure"
        return lambda: asyncio.current_task() is task

    def named() -> bool:
        current = asyncio.current_task()
        return current is not None and current.get_name() == name

    return named


def trace_asyncpg(
    monkeypatch: pytest.MonkeyPatch, *, task: str | None = None
) -> list[tuple[str, bool]]:
    """The statements the measured task (``measured_task(task)``) runs on asyncpg from now
    on (``db/prepared.py``'s path): their first three words, and whether each began a
    transaction. Other tasks' statements meanwhile are not counted."""
    from orchestratord.db import prepared

    mine = measured_task(task)
    seen: list[tuple[str, bool]] = []
    real = prepared.run_on_asyncpg

    async def traced(adapted: Any, conn: Any, sql: str, *args: Any, **kw: Any) -> Any:
        if mine():
            seen.append((" ".join(sql.split()[:3]), bool(kw.get("begin", True))))
        return await real(adapted, conn, sql, *args, **kw)

    monkeypatch.setattr(prepared, "run_on_asyncpg", traced)
    return seen


@contextmanager
def trace_executions(engine: Any, *, task: str | None = None) -> Iterator[list[str]]:
    """The statements the measured task (``measured_task(task)``) runs through SQLAlchemy's
    execution (its ``before_cursor_execute`` event) while the block runs, whitespace folded;
    other tasks' statements meanwhile are not counted."""
    mine = measured_task(task)
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if mine():
            seen.append(" ".join(statement.split()))

    sync_engine = getattr(engine, "sync_engine", engine)
    event.listen(sync_engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(sync_engine, "before_cursor_execute", before)


class DispatcherWake(asyncio.Event):
    """A dispatcher's wake-up that says (``idle``) when the dispatcher waits for one with
    none pending: the round the last one asked for is over, and nothing else is to do.
    Install it before the service starts (``orch.dispatcher._wake = DispatcherWake()``):
    the loop waits on the event it found."""

    def __init__(self) -> None:
        super().__init__()
        self.idle = asyncio.Event()

    async def wait(self) -> Literal[True]:
        if not self.is_set():
            self.idle.set()
        try:
            return await super().wait()
        finally:
            self.idle.clear()

    def set(self) -> None:
        self.idle.clear()
        super().set()


async def dispatcher_settled(orch: Any) -> None:
    """Until the dispatcher (its wake-up a ``DispatcherWake``) has nothing to do: its
    steps' executions over (each ended one may wake it), then every round asked for run."""
    tasks = [e.task for e in orch.dispatcher.executions.values() if e.task is not None]
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    await dispatcher_idle(orch)


async def dispatcher_idle(orch: Any) -> None:
    """Until the dispatcher (its wake-up a ``DispatcherWake``) waits for a wake-up with
    none pending: every round asked for so far has run."""
    wake = orch.dispatcher._wake
    assert isinstance(wake, DispatcherWake), "install a DispatcherWake before the start"
    await asyncio.wait_for(wake.idle.wait(), 30)


def follower_waits(orch: Any, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set when a follower of a stream on ``orch`` has read all there is and waits on its
    hub for more."""
    from orchestratord.streams.hub import Channel

    waits = asyncio.Event()
    real = Channel.wait
    hub = orch.hub

    async def wait(self: Channel, cursor: int, timeout: float) -> bool:
        if self in (*hub._runs.values(), *hub._steps.values()):
            waits.set()
        return await real(self, cursor, timeout)

    monkeypatch.setattr(Channel, "wait", wait)
    return waits


def when_called(
    owner: Any, name: str, monkeypatch: pytest.MonkeyPatch, done: Callable[..., bool]
) -> asyncio.Event:
    """Set once a call of ``owner.name`` returns and ``done(*args)`` holds then (``owner``
    an instance: its attribute is replaced for the test)."""
    called = asyncio.Event()
    real = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if done(*args, **kwargs):
            called.set()
        return result

    monkeypatch.setattr(owner, name, wrapped)
    return called


class StreamsWatch:
    """Says when the streams open on ``orch`` change: a follower subscribes to its hub or
    leaves it, a key's stream opens or closes. ``until(done)`` checks ``done()`` at each
    such change, not on a timer."""

    _CALLS = {
        "hub": ("subscribe_step", "unsubscribe_step", "subscribe_run", "unsubscribe_run"),
        "key_streams": ("open", "close"),
    }

    def __init__(self, orch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self._changed = asyncio.Event()
        for owner, names in self._CALLS.items():
            for name in names:
                monkeypatch.setattr(getattr(orch, owner), name, self._noted(orch, owner, name))

    def _noted(self, orch: Any, owner: str, name: str) -> Callable[..., Any]:
        real = getattr(getattr(orch, owner), name)

        def noted(*args: Any, **kwargs: Any) -> Any:
            try:
                return real(*args, **kwargs)
            finally:
                self._changed.set()

        return noted

    async def until(self, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Until ``done()`` holds (checked now and at each change), or fail."""
        async with asyncio.timeout(timeout_s):
            while not done():
                self._changed.clear()
                await self._changed.wait()


async def tokens_published(orch: Any, step_id: str, n: int) -> None:
    """Until ``step_id``, run by ``orch``, has committed at least ``n`` token events: the log
    is read again each time the process hands committed events of the step to its hub."""
    channel = orch.hub.subscribe_step(step_id)
    try:
        async with asyncio.timeout(10):
            while True:
                cursor = channel.last + 1  # before the read: a commit meanwhile wakes the wait
                events = await stored_events(orch.db, step_id=step_id)
                if sum(1 for e in events if e.type == "token") >= n:
                    return
                await channel.wait(cursor, 10)
    finally:
        orch.hub.unsubscribe_step(step_id)
