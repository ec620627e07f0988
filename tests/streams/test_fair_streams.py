"""Streams catching up share the event loop: a page at a time, in turns, and a client that
does not read holds a page, not the loop and not the log."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

from orchestratord.api.app import create_app
from orchestratord.eventlog import LogEvent
from orchestratord.runtime import Orchestrator
from orchestratord.streams import sse
from orchestratord.streams.sse import follow_run, follow_step
from test_harness.servers import InLoopServer
from tests.conftest import make_settings
from tests.helpers import make_run, parse_sse, read_stream, submit, wait_status

BATCH = 100  # read_batch: events per page
TOKENS = 1000  # a step's tokens: its log is ten pages and more


@contextlib.asynccontextmanager
async def serve_app(app: Any) -> AsyncIterator[str]:
    """``test_harness.servers.serve_app`` with a small socket send buffer (the accepted
    sockets inherit it): a client that does not read fills it, and the server's own buffer,
    within a few hundred KiB (the kernel would otherwise take megabytes first)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
    sock.bind(("127.0.0.1", 0))
    server = InLoopServer(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def served(
    db_url: str, **stream: Any
) -> AsyncIterator[tuple[Orchestrator, httpx.AsyncClient]]:
    """A started Orchestrator with these stream settings, behind a loopback server."""
    orch = Orchestrator(make_settings(db_url, stream={"read_batch": BATCH, **stream}))
    await orch.start()
    try:
        async with (
            serve_app(create_app(orchestrator=orch)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            yield orch, client
    finally:
        await orch.stop()


class Reads:
    """The log reads the followers make: (key, cursor, limit, events returned), and how many
    are in hand at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.done: list[tuple[str, int, int, int]] = []
        self.in_hand = 0
        self.most_in_hand = 0
        for name in ("read_step_events", "read_run_events"):
            monkeypatch.setattr(sse, name, self._counting(getattr(sse, name)))

    def _counting(self, real: Any) -> Any:
        async def read(db: Any, key: str, cursor: int, limit: int) -> list[LogEvent]:
            self.in_hand += 1
            self.most_in_hand = max(self.most_in_hand, self.in_hand)
            try:
                got: list[LogEvent] = await real(db, key, cursor, limit)
            finally:
                self.in_hand -= 1
            self.done.append((key, cursor, limit, len(got)))
            return got

        return read


class Ticker:
    """A task that counts the event loop's turns it gets: another task making progress."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def events_in(frame: bytes) -> int:
    return frame.count(b"\nevent: ")


@pytest.mark.parametrize("source", ["log", "memory"])
async def test_a_catch_up_goes_a_bounded_page_at_a_time_and_lets_other_tasks_run(
    db_url: str, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ended step's stream, read from the log (its channel not kept: a tail of 16) or from
    the tail the hub keeps: pages of at most ``read_batch`` events, the log read a page per
    query, and between two pages another task gets the loop."""
    buffer = 16 if source == "log" else 4096
    async with served(db_url, buffer_events=buffer) as (orch, client):
        run_id = await make_run(client)
        step_id = (await submit(client, run_id, max_tokens=TOKENS)).json()["step_id"]
        await wait_status(client, step_id, "succeeded")
        assert (orch.hub.known_step(step_id) is not None) == (source == "memory")
        reads = Reads(monkeypatch)
        ticks_at: list[int] = []
        sizes: list[int] = []
        async with Ticker() as ticker:
            async for frame in follow_step(orch, step_id, 0, cancel_on_disconnect=False):
                ticks_at.append(ticker.ticks)
                sizes.append(events_in(frame))
    total = sum(sizes)
    assert total >= TOKENS + 3  # started, narration, the tokens, end
    assert max(sizes) <= BATCH and len(sizes) >= total // BATCH
    assert all(b > a for a, b in itertools.pairwise(ticks_at)), ticks_at
    if source == "log":
        assert len(reads.done) >= total // BATCH
        assert all(limit == BATCH and got <= BATCH for _, _, limit, got in reads.done)
    else:
        assert reads.done == []


@pytest.mark.parametrize("setting", [None, 2], ids=["default", "set"])
async def test_streams_catching_up_together_read_the_log_in_turns(
    db_url: str, monkeypatch: pytest.MonkeyPatch, setting: int | None
) -> None:
    """Twenty run streams catching up at once: at most the process's turns of log reads in
    hand at a time (by default one on SQLite, whose reads run on the loop, and a few on
    PostgreSQL; ``stream.catch_up_turns`` sets it), each a page, and every stream gets its
    run's events in order, once."""
    async with served(db_url, catch_up_turns=setting) as (orch, client):
        run_id = await make_run(client)
        step_id = (await submit(client, run_id, max_tokens=TOKENS)).json()["step_id"]
        await wait_status(client, step_id, "succeeded")
        assert (
            await client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
        ).is_success
        reads = Reads(monkeypatch)

        async def catch_up() -> list[int]:
            ids: list[int] = []
            async for frame in follow_run(orch, run_id, 0):
                events, _ = parse_sse(frame.decode())
                ids += [int(e.id or -1) for e in events]
            return ids

        streams = await asyncio.gather(*(catch_up() for _ in range(20)))
        turns = setting or (1 if orch.db.is_sqlite else 4)
    assert reads.most_in_hand <= turns
    if setting is not None and not orch.db.is_sqlite:  # as many at once as it lets
        assert reads.most_in_hand == turns
    assert all(got <= BATCH for _, _, _, got in reads.done)
    assert len(reads.done) >= 20 * (TOKENS // BATCH)
    for ids in streams:
        assert ids == list(range(len(ids))) and len(ids) >= TOKENS + 4  # ... end, run_end


def _stalled_connection(url: str, path: str) -> socket.socket:
    """A client that asks for a stream and then reads nothing: a receive window of a few
    KiB, soon full, then the server's socket buffer, then its transport's."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window
    sock.connect((host, int(port)))
    sock.setblocking(False)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n".encode())
    return sock


async def _read_all(sock: socket.socket, until: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    data = bytearray()
    while not data.endswith(until):
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 30)
        assert chunk, "the server closed the stream before its end"
        data += chunk
    return bytes(data)


def _dechunk(raw: bytes) -> str:
    """The body of a chunked HTTP/1.1 response."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    body = bytearray()
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2 :]
    return body.decode()


async def test_a_reader_that_does_not_read_holds_up_nothing_and_then_gets_every_event_once(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client opens the stream of a long ended step and reads nothing: its follower stops
    pulling once the socket's buffers are full (a bounded part of the log, no event
    dropped); meanwhile another step runs and streams to its end and requests are answered;
    then the slow client reads, and gets every event of the step exactly once, in order."""
    tokens = 10_000  # about 1.3 MB of frames: many times what the socket buffers hold
    async with served(db_url, buffer_events=16) as (_, client):
        run_id = await make_run(client)
        long_id = (await submit(client, run_id, token="long", max_tokens=tokens)).json()["step_id"]
        await wait_status(client, long_id, "succeeded")
        reads = Reads(monkeypatch)
        sock = _stalled_connection(str(client.base_url), f"/v1/steps/{long_id}/stream")
        try:

            def pulled() -> int:
                return sum(got for key, _, _, got in reads.done if key == long_id)

            # the follower fills the buffers, then waits on the socket: it pulls no more
            for _ in range(100):
                before = pulled()
                await asyncio.sleep(0.3)
                if pulled() == before and before > 0:
                    break
            else:
                raise AssertionError(f"the stalled stream's follower never stopped: {pulled()}")
            # not the log: what the socket buffers hold, and a page at a time
            assert pulled() < tokens / 2
            assert all(got <= BATCH for key, _, _, got in reads.done if key == long_id)

            # everything else goes on meanwhile
            assert (await client.get("/v1/pools")).status_code == 200
            other = await submit(client, run_id, token="other", max_tokens=50)
            assert other.status_code in (200, 201, 202)
            events = await read_stream(client, f"/v1/steps/{other.json()['step_id']}/stream")
            assert [e.event for e in events].count("token") == 50
            assert events[-1].event == "end"
            assert pulled() == before  # and the stalled stream still pulls nothing

            raw = await _read_all(sock, b"\r\n0\r\n\r\n")  # the body's last chunk
        finally:
            sock.close()
    got, _ = parse_sse(_dechunk(raw))
    assert [e.id for e in got] == [str(i) for i in range(len(got))]  # in order, no gap, once
    assert [e.event for e in got].count("token") == tokens and got[-1].event == "end"
    assert [e.data["i"] for e in got if e.event == "token" and e.data] == list(range(tokens))


@pytest.mark.parametrize("kind", ["step", "run"])
async def test_a_stream_whose_reads_meet_a_database_outage_waits_and_goes_on(
    db_url: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log cannot be read for a while (the database restarting): the stream keeps its
    connection, reads again after a short wait, and sends every event once, in order, in
    one response (no reset for the client to resume from)."""
    from orchestrator_core.errors import DatabaseUnavailable

    async with served(db_url, buffer_events=16) as (_, client):
        run_id = await make_run(client)
        step_id = (await submit(client, run_id, max_tokens=TOKENS)).json()["step_id"]
        await wait_status(client, step_id, "succeeded")
        await client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
        refused: list[int] = []
        name = "read_step_events" if kind == "step" else "read_run_events"
        real = getattr(sse, name)

        async def away_then_back(db: Any, key: str, cursor: int, limit: int) -> Any:
            if cursor > 0 and len(refused) < 3:  # after the first page: mid-stream
                refused.append(cursor)
                raise DatabaseUnavailable("connection refused")
            return await real(db, key, cursor, limit)

        monkeypatch.setattr(sse, name, away_then_back)
        path = f"/v1/steps/{step_id}/stream" if kind == "step" else f"/v1/runs/{run_id}/stream"
        events = await read_stream(client, path)
    assert len(refused) == 3
    ids = [int(e.id) for e in events if e.id is not None]
    assert ids == list(range(len(ids))) and len(ids) >= TOKENS + 3
    assert events[-1].event == ("end" if kind == "step" else "run_end")
