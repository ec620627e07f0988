"""Several real orchestratord processes on one PostgreSQL database, and what tests ask them.

The engine is a fake OpenAI-compatible server in the test process, shared by every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx

from orchestratord.eventlog import WAKE_CHANNEL
from test_harness.fake_openai import FakeState, create_fake_openai
from test_harness.servers import serve_app
from tests.pg import create_database, drop_database, require_postgres
from tests.procs import free_port

LEASE_S = 1.0
TERMINAL = ("succeeded", "failed", "cancelled")
_T = TypeVar("_T")


class Fleet:
    """orchestratord processes named ``p0``, ``p1``...: started, killed, restarted."""

    def __init__(
        self,
        tmp: Path,
        db_url: str,
        engine_url: str,
        *,
        slots: int = 16,
        replicas: tuple[str, ...] = ("f1",),
        **env: str,
    ) -> None:
        self.tmp = tmp
        self.db_url = db_url
        pools = tmp / "pools.yaml"
        lines = "".join(
            f"      - {{replica_id: {r}, url: '{engine_url}/v1', model: fake-model,"
            f" slots: {slots}}}\n"
            for r in replicas
        )
        pools.write_text("pools:\n  - pool_id: gpu\n    engine: openai\n    replicas:\n" + lines)
        prices = tmp / "prices"
        prices.mkdir(exist_ok=True)
        (prices / "2026-01-01.yaml").write_text(
            'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
            "  - {engine: openai, model: fake-model, input_per_million_usd: 1.0,"
            " output_per_million_usd: 2.0}\n"
        )
        self.env = {
            "ORCHESTRATORD_POOLS_FILE": str(pools),
            "ORCHESTRATORD_PRICE_TABLES_DIR": str(prices),
            "ORCHESTRATORD_DISPATCH__LEASE_S": str(LEASE_S),
            "ORCHESTRATORD_DISPATCH__POLL_S": "0.1",
            "ORCHESTRATORD_LOG_LEVEL": "warning",
            **env,
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}

    async def start(self, name: str) -> str:
        port = free_port()
        log = (self.tmp / f"{name}-{time.monotonic_ns()}.log").open("wb")
        cmd = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port)]
        proc = subprocess.Popen(
            [*cmd, "--database-url", self.db_url],
            cwd=self.tmp,
            env={**os.environ, **self.env, "ORCHESTRATORD_INSTANCE": name},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()  # the child holds its own descriptor
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=1) as c:
            for _ in range(600):
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited: {Path(log.name).read_text()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get(f"{url}/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"{name} not ready: {Path(log.name).read_text()[-3000:]}")
        self.procs[name], self.urls[name] = proc, url
        return url

    def kill(self, name: str, sig: int = signal.SIGKILL) -> subprocess.Popen[bytes]:
        proc = self.procs.pop(name)
        self.urls.pop(name)
        proc.send_signal(sig)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()


def fresh_database() -> Iterator[str]:
    """A PostgreSQL database of its own, dropped after (the fixture ``fresh_db``)."""
    require_postgres()
    url = create_database()
    yield url
    drop_database(url)


@contextlib.asynccontextmanager
async def fleet_on(
    db_url: str,
    tmp: Path,
    fake: FakeState,
    *,
    slots: int = 16,
    replicas: tuple[str, ...] = ("f1",),
    **env: str,
) -> AsyncIterator[tuple[Fleet, asyncpg.Connection]]:
    async with serve_app(create_fake_openai(fake)) as engine_url:
        fleet = Fleet(tmp, db_url, engine_url, slots=slots, replicas=replicas, **env)
        try:
            await fleet.start("p0")  # migrates the fresh database first
            conn = await asyncpg.connect(db_url.replace("+asyncpg", ""))
            await conn.add_listener(WAKE_CHANNEL, _committed)
            try:
                yield fleet, conn
            finally:
                await conn.close()
        finally:
            fleet.stop_all()


async def submit(c: httpx.AsyncClient, run_id: str, prompt: str, max_tokens: int) -> str:
    r = await c.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": prompt,
            "input": {"prompt": prompt, "params": {"max_tokens": max_tokens}},
        },
    )
    assert r.status_code == 202, r.text
    return str(r.json()["step_id"])


async def new_run(c: httpx.AsyncClient) -> str:
    r = await c.post("/v1/flows", json={"ast": {"p": "scale"}})
    assert r.status_code in (200, 201), r.text
    flow = r.json()
    r = await c.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 1})
    assert r.status_code == 201, r.text
    return str(r.json()["run_id"])


_COMMITS: list[asyncio.Event] = []  # one for each wait in progress


def _committed(*_: object) -> None:
    """A process committed events to the log (their NOTIFY on the wake-up channel)."""
    for commit in _COMMITS:
        commit.set()


async def on_commits(check: Callable[[], Awaitable[_T | None]], within_s: float, what: str) -> _T:
    """``check()``'s first answer that is not None: asked now and again each time a process
    commits events (a step claimed starts, a token, an end all append one), not on a timer;
    asked a last time once ``within_s`` has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    commit = asyncio.Event()
    _COMMITS.append(commit)
    try:
        while True:
            commit.clear()  # before asking: a commit meanwhile asks again
            found = await check()
            if found is not None:
                return found
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"{what}: not within {within_s:.1f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(commit.wait(), left)
    finally:
        _COMMITS.remove(commit)


async def wait_terminal(c: httpx.AsyncClient, step_id: str, within_s: float) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        body: dict[str, Any] = (await c.get(f"/v1/steps/{step_id}")).json()
        return body if body["status"] in TERMINAL else None

    return await on_commits(ended, within_s, f"step {step_id} terminal")
