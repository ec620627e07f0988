"""What the chaos tests share: real ``orchestratord serve`` processes on the sim engine, and
a client that follows a step's stream the way an interpreter does (resuming with
``Last-Event-ID`` whenever the stream breaks or a reconnect is refused)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import SseEvent, parse_sse
from tests.procs import free_port


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@contextlib.asynccontextmanager
async def serving(
    tmp: Path, db_url: str, names: list[str], env: Mapping[str, str]
) -> AsyncIterator[dict[str, Server]]:
    """``orchestratord serve --engine sim`` processes named ``names`` on ``db_url``, started
    one after the other (the first migrates); every one is stopped after, even on failure."""
    servers: dict[str, Server] = {}
    try:
        for name in names:
            servers[name] = await _start(tmp, db_url, name, env)
        yield servers
    finally:
        for server in servers.values():
            _stop(server.proc)


async def _start(tmp: Path, db_url: str, name: str, env: Mapping[str, str]) -> Server:
    port = free_port()
    log = tmp / f"{name}.log"
    cmd = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim"]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), "--database-url", db_url],
            cwd=tmp,
            env={**os.environ, **env, "ORCHESTRATORD_INSTANCE": name},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(name, f"http://127.0.0.1:{port}", proc, log)
    try:
        async with httpx.AsyncClient(timeout=1) as c:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited: {server.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get(f"{server.url}/healthz")).status_code == 200:
                        return server
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name} not ready: {server.log_tail()}")
                await asyncio.sleep(0.1)
    except BaseException:
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


@dataclass
class Followed:
    """A step's stream as one client read it across reconnects."""

    step_id: str
    events: list[SseEvent] = field(default_factory=list)  # the frames with an id, in order
    reconnects: int = 0
    refused: list[tuple[int, dict[str, Any], str | None]] = field(default_factory=list)

    @property
    def last_id(self) -> str | None:
        return self.events[-1].id if self.events else None

    @property
    def ended(self) -> bool:
        return bool(self.events) and self.events[-1].event in ("end", "error")


async def follow(
    c: httpx.AsyncClient,
    step_id: str,
    *,
    within_s: float,
    retry_s: float = 0.1,
    out: Followed | None = None,
) -> Followed:
    """The step's stream from its start to its terminal event: when it breaks, or a
    reconnect is refused (retriable, with ``Retry-After``), it resumes after the last event
    id it received, as a client of the contract does. ``out`` (to watch it meanwhile)
    receives the events as they come."""
    out = out if out is not None else Followed(step_id)
    loop = asyncio.get_running_loop()
    wait_s = retry_s
    deadline = loop.time() + within_s
    while True:
        if loop.time() > deadline:
            raise AssertionError(
                f"step {step_id}: no end within {within_s}s "
                f"({len(out.events)} events, last {out.events[-1:]})"
            )
        headers = {"Last-Event-ID": out.last_id} if out.last_id is not None else {}
        try:
            async with c.stream("GET", f"/v1/steps/{step_id}/stream", headers=headers) as r:
                if r.status_code != 200:
                    body = (await r.aread()).decode()
                    after = r.headers.get("retry-after")
                    out.refused.append((r.status_code, _json(body), after))
                    # as the server asks (a client of the contract would wait all of it)
                    wait_s = min(float(after), 1.0) if after and after.isdigit() else retry_s
                else:
                    lines: list[str] = []
                    async for line in r.aiter_lines():
                        if line:
                            lines.append(line)
                            continue
                        events, _ = parse_sse("\n".join(lines))
                        lines = []
                        out.events += [e for e in events if e.id is not None]
                        if out.ended:
                            return out
        except httpx.HTTPError:
            pass  # the stream broke: resume after the last event received
        out.reconnects += 1
        await asyncio.sleep(wait_s)
        wait_s = retry_s


def _json(body: str) -> dict[str, Any]:
    import orjson

    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {"raw": body}
    return value if isinstance(value, dict) else {"raw": body}


def assert_whole(followed: Followed) -> None:
    """Seqs 0..n-1 with no gap and no repeat, ``started`` first, one terminal event last."""
    ids = [e.id for e in followed.events]
    assert ids == [str(i) for i in range(len(ids))], (followed.step_id, ids)
    kinds = [e.event for e in followed.events]
    assert kinds[0] == "started", (followed.step_id, kinds[:3])
    assert kinds[-1] in ("end", "error"), (followed.step_id, kinds[-3:])
    assert kinds.count("end") + kinds.count("error") == 1, (followed.step_id, kinds)
