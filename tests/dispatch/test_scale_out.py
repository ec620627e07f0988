"""Several real orchestratord processes on one PostgreSQL database: one service.

kill -9 of the process executing a step mid-stream, again and again; following and
cancelling across processes; SIGTERM with open streams that resume on another process.
The engine is a fake OpenAI-compatible server in the test process, shared by every
orchestratord process, which counts the generations it streamed to their end per prompt.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from test_harness.fake_openai import FakeState, Faults
from tests.fleet import (
    LEASE_S,
    fleet_on,
    fresh_database,
    new_run,
    on_commits,
    submit,
    wait_terminal,
)
from tests.helpers import parse_sse

pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("ORCHESTRATORD_TEST_KILLS", "50"))


@pytest.fixture
def fresh_db() -> Iterator[str]:
    yield from fresh_database()


def complete_log(text: str) -> list[Any]:
    events, _ = parse_sse(text)
    assert [e.id for e in events] == [str(i) for i in range(len(events))]  # no gap, no repeat
    kinds = [e.event for e in events]
    assert kinds[0] == "started" and kinds[-1] in ("end", "error")
    assert kinds.count("end") + kinds.count("error") == 1
    return events


async def test_kill_9_mid_stream_loses_nothing_and_runs_nothing_twice(
    fresh_db: str, tmp_path: Path
) -> None:
    fake = FakeState(faults=Faults(token_delay_s=0.01))
    async with fleet_on(fresh_db, tmp_path, fake) as (fleet, conn):
        await asyncio.gather(fleet.start("p1"), fleet.start("p2"))
        accepted: dict[str, str] = {}  # step_id -> prompt
        victims: list[str] = []
        restarts: list[asyncio.Task[str]] = []
        for k in range(KILLS):
            while len(fleet.urls) < 2:  # a process to submit to, one to kill
                await asyncio.wait(restarts, return_when=asyncio.FIRST_COMPLETED)
                restarts = [t for t in restarts if not t.done()]
            base = random.choice(list(fleet.urls.values()))
            batch = []
            async with httpx.AsyncClient(base_url=base, timeout=30) as via:
                run_id = await new_run(via)
                for j in range(3):
                    prompt = f"kill {k} step {j}"
                    step_id = await submit(via, run_id, prompt, 60)
                    accepted[step_id] = prompt
                    batch.append(step_id)

            # the process executing one of them, once it has committed a token
            async def streaming(batch: list[str] = batch) -> tuple[str, str] | None:
                row = await conn.fetchrow(
                    "SELECT s.step_id, s.lease_owner FROM steps s WHERE s.status = 'running'"
                    " AND s.step_id = ANY($1::text[]) AND EXISTS (SELECT 1 FROM events e"
                    " WHERE e.step_id = s.step_id AND e.type = 'token') LIMIT 1",
                    batch,
                )
                if row is None or row["lease_owner"].split("#")[0] not in fleet.procs:
                    return None
                return row["step_id"], row["lease_owner"].split("#")[0]

            victim, owner = await on_commits(streaming, 8, "a step streaming on a live process")
            fleet.kill(owner).wait()
            killed_at = time.monotonic()
            victims.append(victim)
            restarts.append(asyncio.create_task(fleet.start(owner)))
            # terminal within the lease + 5 s, seen through a live process
            other = next(iter(fleet.urls.values()))
            async with httpx.AsyncClient(base_url=other, timeout=30) as c2:
                left = LEASE_S + 5 - (time.monotonic() - killed_at)
                step = await wait_terminal(c2, victim, left)
            assert step["status"] == "failed" and step["error"]["code"] == "WORKER_LOST"
        await asyncio.gather(*restarts)
        base = next(iter(fleet.urls.values()))
        async with httpx.AsyncClient(base_url=base, timeout=30) as c2:
            for step_id, prompt in accepted.items():
                step = await wait_terminal(c2, step_id, 60)  # 0 accepted steps lost
                # 0 run twice: the engine streamed each prompt to its end at most once
                assert fake.completed_by_prompt[prompt] <= 1, (step_id, prompt)
                if step["status"] == "succeeded":
                    assert fake.completed_by_prompt[prompt] == 1
            for step_id in victims:
                text = (await c2.get(f"/v1/steps/{step_id}/stream")).text
                events = complete_log(text)
                step = (await c2.get(f"/v1/steps/{step_id}")).json()
                tokens = [e.data["t"] for e in events if e.event == "token" and e.data]
                assert tokens and step["output"]["text"] == "".join(tokens)
                assert step["usage"]["tokens_out"] == len(tokens)
        reserved = await conn.fetchval(
            "SELECT COALESCE(SUM(tokens_in_reserved + tokens_out_reserved), 0) FROM runs"
        )
        assert reserved == 0  # every reservation settled, the crashed steps' too
        assert await conn.fetchval("SELECT count(*) FROM steps") == len(accepted)


async def owner_of(conn: asyncpg.Connection, step_id: str) -> str:
    async def running() -> str | None:
        owner = await conn.fetchval(
            "SELECT lease_owner FROM steps WHERE step_id = $1 AND status = 'running'", step_id
        )
        return None if owner is None else str(owner).split("#")[0]

    return await on_commits(running, 8, f"step {step_id} running")


async def test_follow_and_cancel_across_processes(fresh_db: str, tmp_path: Path) -> None:
    fake = FakeState(faults=Faults(token_delay_s=0.01))
    async with fleet_on(fresh_db, tmp_path, fake) as (fleet, conn):
        await fleet.start("p1")
        async with httpx.AsyncClient(base_url=fleet.urls["p0"], timeout=30) as a:
            run_id = await new_run(a)
            step_id = await submit(a, run_id, "a long one", 2000)
        owner = await owner_of(conn, step_id)
        other = fleet.urls["p1" if owner == "p0" else "p0"]
        async with httpx.AsyncClient(base_url=other, timeout=30) as b:
            frames: list[str] = []
            async with b.stream("GET", f"/v1/steps/{step_id}/stream") as r:
                buf = ""
                cancelled_at = None
                async for chunk in r.aiter_text():
                    buf += chunk
                    if cancelled_at is None and buf.count("event: token") >= 20:
                        cancelled_at = time.monotonic()  # followed live from the other process
                        assert (await b.post(f"/v1/steps/{step_id}/cancel")).status_code == 202
                ended_at = time.monotonic()
                frames.append(buf)
            events = complete_log(frames[0])
            assert cancelled_at is not None
            assert events[-1].event == "end" and events[-1].data is not None
            assert events[-1].data["stop_reason"] == "cancelled"
            step = await wait_terminal(b, step_id, 10)
            assert step["status"] == "cancelled"
            # the cancel crossed processes well within the step's 20 s of tokens
            assert ended_at - cancelled_at < 5
            resumed = await b.get(
                f"/v1/steps/{step_id}/stream", headers={"Last-Event-ID": events[10].id or ""}
            )
            assert [e.id for e in parse_sse(resumed.text)[0]] == [
                e.id for e in events[11:]
            ]  # resumed on the other process at an exact cursor


async def test_sigterm_drains_ends_streams_and_they_resume_elsewhere(
    fresh_db: str, tmp_path: Path
) -> None:
    fake = FakeState()
    async with fleet_on(
        fresh_db,
        tmp_path,
        fake,
        ORCHESTRATORD_DISPATCH__DRAIN_S="1",
        ORCHESTRATORD_STREAM__MAX_FOLLOWERS_PER_STEP="2000",  # 1,000 streams of one step
    ) as (
        fleet,
        conn,
    ):
        async with httpx.AsyncClient(base_url=fleet.urls["p0"], timeout=30) as a:
            run_id = await new_run(a)
            r = await a.post(
                f"/v1/runs/{run_id}/steps",
                json={
                    "type": "gate_eval",
                    "client_token": "g",
                    "input": {"expr": 'facts.exists(f, f.type == "go")', "wait_ms": 60_000},
                },
            )
            step_id = r.json()["step_id"]
            assert await owner_of(conn, step_id) == "p0"
        await fleet.start("p1")
        port = int(fleet.urls["p0"].rsplit(":", 1)[1])
        streams = [await open_raw_stream(port, step_id) for _ in range(1000)]
        # every stream is open and has its first frame
        await asyncio.gather(*(s.read_until(b"\n\n") for s in streams))
        proc = fleet.kill("p0", signal.SIGTERM)
        sent = time.monotonic()
        tails = await asyncio.gather(*(s.read_to_end() for s in streams))
        await asyncio.to_thread(proc.wait, 30)
        exited = time.monotonic() - sent
        assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
        assert exited < 10, f"took {exited:.1f}s to exit with 1000 open streams"
        last_ids = set()
        for head, tail in zip(streams, tails, strict=True):
            events, _ = parse_sse((head.first + tail).decode())
            assert events[0].event == "started" and events[-1].event not in ("end", "error")
            # what an EventSource resends: the last id it saw (a frame without one, such as
            # the queue narration of the step p0 let go of, does not change it)
            last_ids.add([e.id for e in events if e.id is not None][-1])
        async with httpx.AsyncClient(base_url=fleet.urls["p1"], timeout=30) as b:
            await b.post(f"/v1/runs/{run_id}/facts", json={"type": "go", "data": 1})
            step = await wait_terminal(b, step_id, LEASE_S + 10)
            assert step["status"] == "succeeded"  # taken over by p1 and run there
            for last in last_ids:
                resumed = await b.get(
                    f"/v1/steps/{step_id}/stream", headers={"Last-Event-ID": last or ""}
                )
                events, _ = parse_sse(resumed.text)
                assert events[0].id == str(int(last or 0) + 1) and events[-1].event == "end"


class RawStream:
    """An SSE stream over a bare socket (1000 of them cost little in the test process)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.first = b""

    async def read_until(self, marker: bytes) -> None:
        head = await self.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        self.first = await _dechunk_until(self.reader, marker)

    async def read_to_end(self) -> bytes:
        body = await _dechunk_until(self.reader, None)
        self.writer.close()
        return body


async def _dechunk_until(reader: asyncio.StreamReader, marker: bytes | None) -> bytes:
    body = b""
    while marker is None or marker not in body:
        size = int((await reader.readline()).strip() or b"0", 16)
        if size == 0:
            break
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    return body


async def open_raw_stream(port: int, step_id: str) -> RawStream:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /v1/steps/{step_id}/stream HTTP/1.1\r\nHost: x\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    return RawStream(reader, writer)
