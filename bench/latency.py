"""Time to first token and cost per step: every row of the latency table in one run.

The engine is the fake OpenAI-compatible server of ``test_harness`` (its own process,
streaming as fast as it can). It is read three ways, one after the other:

* **direct**: the client streams ``/v1/completions`` from the engine itself;
* **bare relay** (``bench/openai_bare_relay.py``): upstream chunk -> SSE frame, nothing stored;
* **orchestratord** with an ``openai`` pool on that engine, persistence on (a fresh SQLite
  file; with ``--pg`` also a fresh PostgreSQL database): the client ``POST``s a step and
  follows ``GET /v1/steps/{id}/stream``.

Rows (each a ratio or a difference within this run):

* ``ttft_idle``: one stream at a time, 32 tokens; TTFT = request sent -> first token read
  (for orchestratord: step ``POST`` -> first ``token`` frame). Added = target - direct.
  orchestratord's idle, loaded and steps rows are also measured with one request per step
  (``one_request``: the ``POST`` asks for the step's stream, ``Accept: text/event-stream``).
* ``ttft_loaded``: 50 concurrent streams x 200 tokens, p50/p99 TTFT, added vs direct.
* ``steps``: 1-token steps, 16 clients each submitting and reading to ``end`` in a loop:
  steps/s and the server's CPU per step (everything outside the one token); beside them the
  client's own CPU per step and the machine's busy cores (server, client and engine share
  them: a row that keeps both cores busy is bound by the machine, not by waiting).
* ``relay``: 20 streams x 1000 tokens: tokens per CPU-second of the relaying process.
* ``sim_relay``: the same through ``serve --engine sim`` (no upstream HTTP at all).
* with ``--pg``, the loaded row again against ``--pg-processes`` (2) processes serving one
  PostgreSQL database, the streams spread over them, one request per step.
* ``idle``: 10,000 idle run streams: RSS per stream and CPU share while idle
  (``bench/idle_followers.py``).

    ulimit -n 65536; .venv/bin/python bench/latency.py [--pg] [--quick]

Writes ``bench/results/latency.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import idle_followers  # noqa: E402
from bench.relay import (  # noqa: E402
    PgDatabase,
    Server,
    free_port,
    git_state,
    machine_busy_s,
    postgres_cpu_s,
    server_env,
)

# one stream: (client, index, tokens) -> (ttft seconds, tokens read)
Stream = Callable[[httpx.AsyncClient, int, int], Awaitable[tuple[float, int]]]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def new_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(120, connect=10),
        limits=httpx.Limits(max_connections=2, max_keepalive_connections=2),
    )


async def read_sse(client: httpx.AsyncClient, url: str, t0: float) -> tuple[float, int]:
    async with client.stream("GET", url) as r:
        r.raise_for_status()
        return await count_tokens(r, t0)


async def count_tokens(r: httpx.Response, t0: float) -> tuple[float, int]:
    """(time to the first ``token`` frame since ``t0``, tokens) of an SSE response."""
    ttft, n = 0.0, 0
    async for line in r.aiter_lines():
        if line == "event: token":
            if n == 0:
                ttft = time.perf_counter() - t0
            n += 1
    return ttft, n


def direct_stream(base: str) -> Stream:
    async def one(c: httpx.AsyncClient, i: int, tokens: int) -> tuple[float, int]:
        body = {"model": "fake-model", "prompt": f"p{i}", "max_tokens": tokens, "stream": True}
        t0 = time.perf_counter()
        ttft, n = 0.0, 0
        async with c.stream("POST", f"{base}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if (
                    line.startswith("data: {")
                    and '"text": ""' not in line
                    and '"choices": []' not in line
                ):
                    if n == 0:
                        ttft = time.perf_counter() - t0
                    n += 1
        return ttft, n

    return one


def bare_stream(base: str) -> Stream:
    async def one(c: httpx.AsyncClient, i: int, tokens: int) -> tuple[float, int]:
        return await read_sse(c, f"{base}/relay?tokens={tokens}", time.perf_counter())

    return one


def orchestrated_stream(base: str, run_ids: list[str], *, one_request: bool = False) -> Stream:
    """A step submitted, then its stream followed; ``one_request``: the submission asks for
    the stream itself (``Accept: text/event-stream``)."""

    def step(i: int, tokens: int) -> tuple[str, dict[str, Any]]:
        body = {
            "type": "llm_call",
            "client_token": uuid.uuid4().hex,
            "input": {"prompt": f"p{i}", "params": {"max_tokens": tokens}},
        }
        return f"{base}/v1/runs/{run_ids[i % len(run_ids)]}/steps", body

    async def two(c: httpx.AsyncClient, i: int, tokens: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        url, body = step(i, tokens)
        r = await c.post(url, json=body)
        if r.status_code not in (200, 202):
            raise RuntimeError(f"step POST {r.status_code}: {r.text[:300]}")
        return await read_sse(c, f"{base}/v1/steps/{r.json()['step_id']}/stream", t0)

    async def one(c: httpx.AsyncClient, i: int, tokens: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        url, body = step(i, tokens)
        async with c.stream("POST", url, json=body, headers=_SSE) as r:
            if r.status_code not in (200, 202):
                raise RuntimeError(f"step POST {r.status_code}: {(await r.aread())[:300]!r}")
            return await count_tokens(r, t0)

    return one if one_request else two


_SSE = {"Accept": "text/event-stream"}


class Target:
    def __init__(
        self, name: str, stream: Stream, server: Server | None, servers: Sequence[Server] = ()
    ) -> None:
        self.name, self.stream, self.server = name, stream, server
        self.servers = list(servers) if servers else ([server] if server else [])

    def cpu(self) -> float:
        """CPU seconds of the serving processes so far."""
        return sum(s.cpu_s() or 0.0 for s in self.servers)

    def preemptions(self) -> int:
        """Times the serving processes were switched out while they could run, so far."""
        return sum(s.preemptions() or 0 for s in self.servers)


async def idle_ttft(t: Target, n: int) -> dict[str, float]:
    async with new_client() as c:
        for i in range(5):
            await t.stream(c, i, 32)
        ttfts = [(await t.stream(c, i, 32))[0] * 1000 for i in range(n)]
    return {"p50_ms": statistics.median(ttfts), "p99_ms": pct(ttfts, 99)}


class BusyTimeline:
    """The machine's busy CPU seconds (``/proc/stat``) and this process's own, sampled every
    few milliseconds while a burst runs: how busy the cores were up to a given moment of it
    (the kernel counts them per tick, 10 ms: a window of 100 ms is read within about 10%)."""

    def __init__(self, servers: Sequence[Server] = (), every_s: float = 0.004) -> None:
        self.every_s = every_s
        self.servers = servers
        # (perf_counter, busy, own CPU, the servers' CPU)
        self.samples: list[tuple[float, float, float, float]] = []
        self._task: asyncio.Task[None] | None = None

    def _sample(self) -> None:
        busy = machine_busy_s()
        if busy is not None:
            served = sum(s.cpu_s() or 0.0 for s in self.servers)
            self.samples.append((time.perf_counter(), busy, time.process_time(), served))

    async def _run(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(self.every_s)

    def __enter__(self) -> BusyTimeline:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self._sample()

    def _at(self, t: float, k: int) -> float:
        """Field ``k`` of the samples at time ``t``, linear between the two around it."""
        s = self.samples
        for (ta, *a), (tb, *b) in itertools.pairwise(s):
            if ta <= t <= tb:
                return a[k - 1] + (b[k - 1] - a[k - 1]) * ((t - ta) / (tb - ta) if tb > ta else 0)
        return s[-1][k] if t > s[-1][0] else s[0][k]

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """Between ``t0`` and ``t1``: the machine's busy cores, and this process's (the
        client's) and the servers' CPU in milliseconds."""
        if len(self.samples) < 2 or t1 <= t0:
            return {}
        return {
            "busy_cores": (self._at(t1, 1) - self._at(t0, 1)) / (t1 - t0),
            "client_cpu_ms": 1000 * (self._at(t1, 2) - self._at(t0, 2)),
            "server_cpu_ms": 1000 * (self._at(t1, 3) - self._at(t0, 3)),
        }


async def concurrent(t: Target, streams: int, tokens: int) -> dict[str, float]:
    clients = [new_client() for _ in range(streams)]
    try:
        await asyncio.gather(*(t.stream(c, i, 4) for i, c in enumerate(clients)))  # warm
        cpu0, t0, busy0 = t.cpu(), time.perf_counter(), machine_busy_s()
        pg0, switched0, mine0 = postgres_cpu_s(), t.preemptions(), time.process_time()
        with BusyTimeline(t.servers) as timeline:
            out = await asyncio.gather(*(t.stream(c, i, tokens) for i, c in enumerate(clients)))
        wall, cpu, busy1 = time.perf_counter() - t0, t.cpu() - cpu0, machine_busy_s()
        pg, switched = postgres_cpu_s() - pg0, t.preemptions() - switched0
        mine = time.process_time() - mine0
    finally:
        for c in clients:
            await c.aclose()
    got = sum(n for _, n in out)
    if got != streams * tokens:
        raise RuntimeError(f"{t.name}: {got} tokens read, {streams * tokens} expected")
    ttfts = [s * 1000 for s, _ in out]
    row = {
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p99_ms": pct(ttfts, 99),
        "tokens_per_s": got / wall,
        "tokens_per_cpu_s": got / cpu if cpu else 0.0,
        "cpu_s": cpu,
        "wall_s": wall,
        # PostgreSQL's processes' CPU meanwhile (any database's: on SQLite, its background),
        # and how often the servers were switched out while they could run
        "postgres_cpu_s": pg,
        "server_preemptions": switched,
        "client_cpu_s": mine,  # this process: the 50 clients (and the sampler)
    }
    if busy0 is not None and busy1 is not None:  # the machine's busy cores meanwhile
        row["machine_busy_cores"] = (busy1 - busy0) / wall
    # up to the p99 first token: what the row measures waited on the cores meanwhile
    window = timeline.window(t0, t0 + row["ttft_p99_ms"] / 1000)
    row.update({f"{k}_to_p99": v for k, v in window.items()})
    return row


# ``concurrent``'s figures from a burst's start to its p99 first token (``BusyTimeline``)
TO_P99 = ("busy_cores_to_p99", "client_cpu_ms_to_p99", "server_cpu_ms_to_p99")


async def steps(t: Target, clients_n: int, per_client: int) -> dict[str, float]:
    clients = [new_client() for _ in range(clients_n)]

    async def loop(k: int) -> None:
        for j in range(per_client):
            _, n = await t.stream(clients[k], k * per_client + j, 1)
            if n != 1:
                raise RuntimeError(f"{t.name}: a 1-token step read {n} tokens")

    try:
        await asyncio.gather(*(t.stream(c, i, 1) for i, c in enumerate(clients)))  # warm
        cpu0, t0 = t.cpu(), time.perf_counter()
        mine0, busy0 = time.process_time(), machine_busy_s()
        await asyncio.gather(*(loop(k) for k in range(clients_n)))
        wall, cpu = time.perf_counter() - t0, t.cpu() - cpu0
        mine, busy1 = time.process_time() - mine0, machine_busy_s()
    finally:
        for c in clients:
            await c.aclose()
    total = clients_n * per_client
    out = {
        "steps_per_s": total / wall,
        "cpu_ms_per_step": cpu / total * 1000,
        # the client's own CPU (this process, its 16 clients), and how many of the machine's
        # cores were busy meanwhile: server, client and engine share them
        "client_cpu_ms_per_step": mine / total * 1000,
    }
    if busy0 is not None and busy1 is not None:
        out["machine_busy_cores"] = (busy1 - busy0) / wall
    return out


_LOADED = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "wall_s",
    "cpu_s",
    "machine_busy_cores",
    "postgres_cpu_s",
    "server_preemptions",
    "client_cpu_s",
    *TO_P99,
)


async def loaded_rounds(t: Target, a: argparse.Namespace) -> dict[str, float]:
    """The loaded row, ``a.repeat`` rounds, each figure's median."""
    rounds = [await concurrent(t, a.streams, a.loaded_tokens) for _ in range(a.repeat)]
    return {k: statistics.median(r.get(k, 0.0) for r in rounds) for k in _LOADED}


async def steps_rounds(t: Target, a: argparse.Namespace) -> dict[str, float]:
    """The steps row, ``a.repeat`` rounds, each figure's median."""
    rounds = [await steps(t, a.step_clients, a.steps_per_client) for _ in range(a.repeat)]
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


async def run_rows(t: Target, a: argparse.Namespace) -> dict[str, Any]:
    print(f"{t.name}", flush=True)
    row: dict[str, Any] = {"ttft_idle": await idle_ttft(t, a.idle_probes)}
    print(f"  idle {row['ttft_idle']}", flush=True)
    row["ttft_loaded"] = await loaded_rounds(t, a)
    print(f"  loaded {row['ttft_loaded']}", flush=True)
    if t.server is not None:
        runs = [await concurrent(t, a.relay_streams, a.relay_tokens) for _ in range(a.repeat)]
        row["relay"] = {
            k: statistics.median(r[k] for r in runs) for k in ("tokens_per_s", "tokens_per_cpu_s")
        }
        print(f"  relay {row['relay']}", flush=True)
        row["steps"] = await steps_rounds(t, a)
        print(f"  steps {row['steps']}", flush=True)
    return row


async def one_request_rows(t: Target, a: argparse.Namespace) -> dict[str, Any]:
    """Idle and loaded TTFT and steps again, each step submitted and followed in one
    request."""
    row: dict[str, Any] = {
        "ttft_idle": await idle_ttft(t, a.idle_probes),
        "ttft_loaded": await loaded_rounds(t, a),
        "steps": await steps_rounds(t, a),
    }
    for name in ("ttft_idle", "ttft_loaded", "steps"):
        print(f"  one request: {name} {row[name]}", flush=True)
    return row


def write_pools(tmp: Path, upstream: str, slots: int) -> dict[str, str]:
    (tmp / "prices").mkdir(exist_ok=True)
    (tmp / "prices" / "2026-01-01.yaml").write_text(
        'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        "  - {engine: openai, model: fake-model, free: true}\n"
        "  - {engine: sim, model: sim-1, free: true}\n"
    )
    replica = {"replica_id": "r1", "url": f"{upstream}/v1", "model": "fake-model", "slots": slots}
    pools = {"pools": [{"pool_id": "gpu", "engine": "openai", "replicas": [replica]}]}
    (tmp / "pools.yaml").write_text(json.dumps(pools))
    return {
        "ORCHESTRATORD_PRICE_TABLES_DIR": str(tmp / "prices"),
        "ORCHESTRATORD_LOG_LEVEL": "warning",
        "ORCHESTRATORD_ADMISSION__INTERACTIVE_CAPACITY": "1000000",
        "ORCHESTRATORD_SIM__TOKENS_PER_S": "0",
        "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
        "ORCHESTRATORD_SIM__SLOTS": str(slots),
    }


async def orchestratord(
    name: str,
    url: str,
    engine_args: list[str],
    env: dict[str, str],
    tmp: Path,
    a: Any,
    tree: Path = ROOT,
    *,
    one_request: bool = True,
) -> dict[str, Any]:
    """The rows of one orchestratord server, run from the checkout ``tree``; with
    ``one_request``, also those a client submitting and following in one request sees."""
    server = await start_orchestratord(name, url, engine_args, env, tmp, tree)
    try:
        runs = await make_runs(server.base_url, max(a.streams, a.step_clients))
        target = Target(name, orchestrated_stream(server.base_url, runs), server)
        single = orchestrated_stream(server.base_url, runs, one_request=True)
        if "--engine" in engine_args:  # the sim row: tokens per CPU-second only
            rounds = [
                await concurrent(target, a.relay_streams, a.relay_tokens) for _ in range(a.repeat)
            ]
            row = {"relay": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}}
            print(f"{name}\n  relay {row['relay']}", flush=True)
            return row
        row = await run_rows(target, a)
        if one_request:
            row["one_request"] = await one_request_rows(Target(name, single, server), a)
        return row
    finally:
        await server.stop()


async def loaded_across(
    name: str, url: str, n: int, env: dict[str, str], tmp: Path, a: Any
) -> dict[str, Any]:
    """The loaded row against ``n`` processes serving one PostgreSQL database: stream ``i``
    is submitted to and followed on process ``i % n``, in one request."""
    pools = ["--pools", str(tmp / "pools.yaml")]
    servers: list[Server] = []
    try:
        for k in range(n):
            servers.append(await start_orchestratord(f"{name} {k}", url, pools, env, tmp))
        runs = await make_runs(servers[0].base_url, a.streams)
        streams = [orchestrated_stream(s.base_url, runs, one_request=True) for s in servers]

        async def across(c: httpx.AsyncClient, i: int, tokens: int) -> tuple[float, int]:
            return await streams[i % n](c, i, tokens)

        row = await loaded_rounds(Target(name, across, None, servers), a)
        print(f"{name}\n  loaded {row}", flush=True)
        return {"ttft_loaded": row}
    finally:
        for server in servers:
            await server.stop()


async def start_orchestratord(
    name: str, url: str, args: list[str], env: dict[str, str], tmp: Path, tree: Path = ROOT
) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port)]
    argv += ["--database-url", url, *args]
    full_env = server_env(env)
    full_env["PYTHONPATH"] = str(tree)
    server = Server(name, argv, full_env, port, tmp / f"{uuid.uuid4().hex}.log")
    server.cwd = tree
    await server.start(timeout_s=120)
    return server


async def make_runs(base: str, n: int) -> list[str]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as c:
        flow = (await c.post("/v1/flows", json={"ast": {"bench": "latency"}})).json()
        return [
            (await c.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": i})).json()["run_id"]
            for i in range(n)
        ]


async def start_engine(tmp: Path) -> tuple[Server, str]:
    """The fake OpenAI-compatible engine in its own process; its base URL."""
    port = free_port()
    argv = [
        sys.executable,
        "-c",
        "import uvicorn; from test_harness.fake_openai import create_fake_openai as f; "
        f"uvicorn.run(f(), host='127.0.0.1', port={port}, log_level='warning')",
    ]
    engine = Server("engine", argv, server_env({}), port, tmp / "engine.log")
    await engine.start(timeout_s=60, probe="/health")
    return engine, f"http://127.0.0.1:{port}"


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp())
    fake, upstream = await start_engine(tmp)
    out: dict[str, Any] = {"git": git_state(), "args": vars(a)}
    try:
        if not a.sim_only:
            await openai_rows(a, upstream, tmp, out)
        env = write_pools(tmp, upstream, max(64, a.streams))
        for label in ("SQLite", "PostgreSQL") if a.pg else ("SQLite",):
            name = f"orchestratord {label}, sim engine"
            out[name] = await on_database(
                label,
                a,
                lambda url, n=name: orchestratord(n, url, ["--engine", "sim"], env, tmp, a),
                tmp,
            )
    finally:
        await fake.stop()
    if a.idle_streams:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * a.idle_streams), hard))
        for label in ("SQLite", "PostgreSQL") if a.pg else ("SQLite",):
            out[f"idle {label}"] = await on_database(label, a, lambda url: idle(url, a, tmp), tmp)
            print(f"idle {label}", out[f"idle {label}"], flush=True)
    return out


async def on_database(label: str, a: Any, body: Any, tmp: Path) -> Any:
    """``body(url)`` on a fresh SQLite file or a fresh PostgreSQL database."""
    if label == "SQLite":
        return await body(f"sqlite:///{tmp / uuid.uuid4().hex}.db")
    async with PgDatabase(a.pg_url) as url:
        return await body(url)


async def idle(url: str, a: Any, tmp: Path) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(
            idle_followers.measure(url, a.idle_streams, 10.0, str(tmp)), a.idle_timeout_s
        )
    except TimeoutError:
        return {"streams": a.idle_streams, "error": f"not measured within {a.idle_timeout_s} s"}


async def openai_rows(a: Any, upstream: str, tmp: Path, out: dict[str, Any]) -> None:
    """direct, bare relay, and orchestratord with an openai pool, on each database."""
    out["direct"] = await run_rows(Target("direct", direct_stream(upstream), None), a)
    port = free_port()
    bare_argv = [sys.executable, "bench/openai_bare_relay.py", "--port", str(port)]
    bare = Server(
        "bare relay",
        [*bare_argv, "--upstream", f"{upstream}/v1"],
        server_env({}),
        port,
        tmp / "bare.log",
    )
    await bare.start(timeout_s=60, probe="/relay?tokens=1")
    try:
        out["bare relay"] = await run_rows(
            Target("bare relay", bare_stream(bare.base_url), bare), a
        )
    finally:
        await bare.stop()
    env = write_pools(tmp, upstream, max(64, a.streams))
    for label in ("SQLite", "PostgreSQL") if a.pg else ("SQLite",):
        name = f"orchestratord {label}"
        out[name] = await on_database(
            label,
            a,
            lambda url, n=name: orchestratord(
                n, url, ["--pools", str(tmp / "pools.yaml")], env, tmp, a
            ),
            tmp,
        )
    if a.pg and a.pg_processes > 1:
        name = f"orchestratord PostgreSQL, {a.pg_processes} processes, one request per step"
        out[name] = await on_database(
            "PostgreSQL", a, lambda url: loaded_across(name, url, a.pg_processes, env, tmp, a), tmp
        )


def report(out: dict[str, Any]) -> str:
    d = out.get("direct")
    if d is None:
        return json.dumps(out, indent=2, default=str)
    lines = [
        "| | added TTFT idle p50 / p99 | added TTFT 50x200 p99 | CPU per step | steps/s "
        "| tokens per CPU-s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in out.items():
        if not isinstance(r, dict) or "ttft_idle" not in r or name == "direct":
            continue
        idle, loaded = r["ttft_idle"], r["ttft_loaded"]
        add50 = idle["p50_ms"] - d["ttft_idle"]["p50_ms"]
        add99 = idle["p99_ms"] - d["ttft_idle"]["p99_ms"]
        addl = loaded["ttft_p99_ms"] - d["ttft_loaded"]["ttft_p99_ms"]
        st, rl = r.get("steps", {}), r.get("relay", {})
        lines.append(
            f"| {name} | {add50:.1f} / {add99:.1f} ms | {addl:.1f} ms | "
            f"{st.get('cpu_ms_per_step', 0):.2f} ms | {st.get('steps_per_s', 0):.0f} | "
            f"{rl.get('tokens_per_cpu_s', 0):,.0f} |"
        )
    for name, r in out.items():
        if not isinstance(r, dict) or "one_request" not in r:
            continue
        one = r["one_request"]
        idle, loaded, st = one["ttft_idle"], one["ttft_loaded"], one["steps"]
        add50 = idle["p50_ms"] - d["ttft_idle"]["p50_ms"]
        add99 = idle["p99_ms"] - d["ttft_idle"]["p99_ms"]
        addl = loaded["ttft_p99_ms"] - d["ttft_loaded"]["ttft_p99_ms"]
        lines.append(
            f"| {name}, one request per step | {add50:.1f} / {add99:.1f} ms | {addl:.1f} ms | "
            f"{st['cpu_ms_per_step']:.2f} ms | {st['steps_per_s']:.0f} | |"
        )
    for name, r in out.items():
        if isinstance(r, dict) and "processes" in name:
            addl = r["ttft_loaded"]["ttft_p99_ms"] - d["ttft_loaded"]["ttft_p99_ms"]
            lines.append(f"| {name} | | {addl:.1f} ms | | | |")
    for name, r in out.items():
        if isinstance(r, dict) and name.endswith("sim engine"):
            lines.append(f"| {name} | | | | | {r['relay']['tokens_per_cpu_s']:,.0f} |")
    for name, r in out.items():
        if not isinstance(r, dict):
            continue
        for label, st in (
            ("", r.get("steps")),
            (", one request", r.get("one_request", {}).get("steps")),
        ):
            if st and "machine_busy_cores" in st:
                lines.append(
                    f"\n{name}{label}, steps row: client CPU {st['client_cpu_ms_per_step']:.2f} ms"
                    f" per step, {st['machine_busy_cores']:.2f} of the machine's cores busy"
                )
    for name, r in out.items():
        loaded = r.get("ttft_loaded") if isinstance(r, dict) else None
        if not loaded or "postgres_cpu_s" not in loaded:
            continue
        # up to the p99 first token: how busy the machine was, and with whom
        window = (
            f"up to the p99 first token {loaded.get('busy_cores_to_p99', 0):.2f} of the"
            f" machine's cores busy, the client's CPU {loaded.get('client_cpu_ms_to_p99', 0):.0f}"
            " ms"
        )
        if name == "direct":
            lines.append(f"\ndirect, loaded row (one burst): {window}")
            continue
        lines.append(
            f"\n{name}, loaded row (one burst): server CPU {1000 * loaded['cpu_s']:.0f} ms,"
            f" PostgreSQL's processes {1000 * loaded['postgres_cpu_s']:.0f} ms, the server"
            f" switched out {loaded['server_preemptions']:.0f} times; {window}, the server's"
            f" {loaded.get('server_cpu_ms_to_p99', 0):.0f} ms"
        )
    for name, r in out.items():
        if name.startswith("idle "):
            lines.append(
                f"\n{name}: {r['streams']} streams, {r['rss_kib_per_stream']} KiB each "
                f"({r['rss_mib_total']} MiB total), {100 * r['server_cpu_share_of_a_core']:.1f}% "
                "of a core while idle"
            )
    return "\n".join(lines)


def add_workload_args(ap: argparse.ArgumentParser, *, idle_probes: int) -> None:
    """The database and the size of each row's workload (shared with bench/ab.py)."""
    ap.add_argument("--pg", action="store_true")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--idle-probes", type=int, default=idle_probes)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--loaded-tokens", type=int, default=200)
    ap.add_argument("--relay-streams", type=int, default=20)
    ap.add_argument("--relay-tokens", type=int, default=1000)
    ap.add_argument("--step-clients", type=int, default=16)
    ap.add_argument("--steps-per-client", type=int, default=25)
    ap.add_argument(
        "--pg-processes", type=int, default=2, help="the loaded row again on N processes (--pg)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_workload_args(ap, idle_probes=30)
    ap.add_argument("--quick", action="store_true", help="smaller rounds, one repeat, no idle row")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--idle-streams", type=int, default=10000)
    ap.add_argument("--idle-timeout-s", type=float, default=300.0)
    ap.add_argument("--sim-only", action="store_true", help="only the sim and idle rows")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "latency.json"))
    a = ap.parse_args()
    if a.quick:
        a.repeat, a.idle_streams, a.idle_probes = 1, 0, 15
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    out = asyncio.run(main_async(a))
    Path(a.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(report(out))


if __name__ == "__main__":
    main()
