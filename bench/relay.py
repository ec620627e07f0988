"""Relay benchmark: how much of the sim engine's token rate reaches SSE clients.

One run measures, with ``--streams`` concurrent streams of ``--tokens`` tokens each:

* ``direct``: ``SimAdapter(tokens_per_s=0, eos_probability=0).stream()`` consumed in this
  process, no HTTP: the engine's own ceiling.
* ``bare relay``: ``bench/bare_relay.py``, a bare Starlette app in its own uvicorn process
  that streams SSE frames straight from the same adapter (same frame and payload shape as
  orchestratord's step events), nothing persisted. Its ``flush16`` variant writes the frames
  of one sim burst (16 tokens) per write; ``flush1`` (extra row) writes every frame alone.
* ``orchestratord``: the real server (``.venv/bin/orchestratord serve``, sim as fast as
  possible, no EOS, slots >= streams, a fresh SQLite file, persistence on); the client
  submits the steps and follows their streams. With ``--pg`` also on a fresh PostgreSQL
  database created (and dropped) here with asyncpg.

The client is this process (one httpx.AsyncClient per stream, all on one event loop, see
``Clients``); every server is a separate process on a free loopback port, started here,
polled on ``GET /healthz`` until ready, and stopped here (SIGINT, then SIGKILL).
Scenarios run one after another, each with a warm-up round; each reported figure is the
median over ``--repeat`` rounds.

Delivered tokens/s = token frames received by all clients / wall time of the round (first
request sent to last stream closed). TTFT = first ``token`` frame received - request sent
(for orchestratord: the step POST). "idle TTFT" is one stream at a time on an idle server.
CPU per token comes from /proc (server process) and ``time.process_time`` (client); "other
CPU" is what the rest of the machine burnt during a round (database server, other jobs).

``--tracing on`` runs orchestratord with OpenTelemetry tracing exported to an OTLP/HTTP
receiver in this process (``OtlpSink``: decodes and counts the spans); ``--tracing both``
runs two servers side by side, off and on, which take turns round by round (and probe by
probe), so that both see the same drift of a shared machine. ``--only-orchestratord``
skips the direct and bare relay scenarios.

Usage: ``.venv/bin/python bench/relay.py [--streams 50] [--tokens 2000] [--repeat 3] [--pg]
[--tracing off|on|both] [--only-orchestratord]``
Writes ``bench/results/relay.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from worker_adapters import Finish, GenerationRequest, Token  # noqa: E402
from worker_adapters.sim import SimAdapter  # noqa: E402

VENV_BIN = Path(sys.executable).parent
TARGET_RATIO = 0.8
TARGET_ADDED_TTFT_MS = 2.0
IDLE_PROBES = 20
IDLE_PROBE_TOKENS = 32
CLK_TCK = os.sysconf("SC_CLK_TCK")

_children: list[subprocess.Popen[bytes]] = []


@atexit.register
def _kill_leftovers() -> None:
    """Last resort: no server of ours outlives this process."""
    for proc in _children:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


# --------------------------------------------------------------------------------------------
# Measurements


@dataclass
class StreamResult:
    tokens: int
    ttft_s: float | None
    ended: bool


@dataclass
class Round:
    wall_s: float
    tokens: int
    delivered_tok_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ok_streams: int
    server_cpu_s: float | None
    client_cpu_s: float
    # CPU time the whole machine spent during the round outside the server and this process
    # (the database server, other jobs): a noise gauge on a shared 2-core machine.
    other_cpu_s: float | None = None


@dataclass
class Scenario:
    name: str
    kind: str
    rounds: list[Round] = field(default_factory=list)
    idle_ttft_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    spans_exported: int | None = None  # tracing on: spans the OTLP receiver got

    def median(self, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.rounds if getattr(r, attr) is not None]
        return statistics.median(values) if values else None

    def summary(self, streams: int) -> dict[str, Any]:
        tokens = self.median("tokens") or 0
        server = self.median("server_cpu_s")
        client = self.median("client_cpu_s")
        return {
            "delivered_tok_s": self.median("delivered_tok_s"),
            "wall_s": self.median("wall_s"),
            "ttft_p50_ms": self.median("ttft_p50_ms"),
            "ttft_p95_ms": self.median("ttft_p95_ms"),
            "idle_ttft_p50_ms": percentile(self.idle_ttft_ms, 50),
            "server_cpu_us_per_token": None
            if server is None or not tokens
            else server / tokens * 1e6,
            "server_cpu_ms_per_step": None if server is None else server / streams * 1e3,
            "client_cpu_us_per_token": None
            if client is None or not tokens
            else client / tokens * 1e6,
            "other_cpu_s": self.median("other_cpu_s"),
            "all_streams_complete": bool(self.rounds)
            and all(r.ok_streams == streams for r in self.rounds)
            and not self.errors,
        }


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def machine_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine so far (all CPUs), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def postgres_cpu_s() -> float:
    """utime + stime of every PostgreSQL server process on the machine so far (its backends
    exit with their connections: take it around a window in which they stay open)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        head, _, rest = stat.rpartition(")")
        if head.endswith("(postgres"):
            fields = rest.split()
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def make_round(
    results: list[StreamResult],
    wall_s: float,
    expect: int,
    server_cpu_s: float | None,
    client_cpu_s: float,
    machine_cpu_s: float | None = None,
) -> Round:
    ttfts = [r.ttft_s * 1000 for r in results if r.ttft_s is not None]
    tokens = sum(r.tokens for r in results)
    return Round(
        wall_s=wall_s,
        tokens=tokens,
        delivered_tok_s=tokens / wall_s if wall_s > 0 else 0.0,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        ok_streams=sum(1 for r in results if r.ended and r.tokens == expect),
        server_cpu_s=server_cpu_s,
        client_cpu_s=client_cpu_s,
        other_cpu_s=None
        if machine_cpu_s is None
        else max(0.0, machine_cpu_s - (server_cpu_s or 0.0) - client_cpu_s),
    )


async def consume_sse(client: httpx.AsyncClient, url: str, t0: float) -> StreamResult:
    """Follow one SSE stream to its end; count ``token`` frames, time the first one."""
    tokens = 0
    ttft: float | None = None
    ended = False
    tail = b""
    async with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RuntimeError(f"GET {url}: {resp.status_code} {resp.text[:200]}")
        async for chunk in resp.aiter_raw():
            data = tail + chunk if tail else chunk
            cut = data.rfind(b"\n\n")
            if cut < 0:
                tail = data
                continue
            done, tail = data[: cut + 2], data[cut + 2 :]
            n = done.count(b"event: token\n")
            if n:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += n
            if b"event: end\n" in done or b"event: error\n" in done:
                ended = True  # keep reading: the server closes the stream, the connection stays
    return StreamResult(tokens, ttft, ended)


def _request(i: int, tokens: int) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"direct-{i}-{uuid.uuid4().hex[:8]}",
        prompt=f"bench stream {i}",
        messages=None,
        seed=i,
        max_tokens=tokens,
    )


async def direct_round(streams: int, tokens: int) -> Round:
    adapter = SimAdapter(tokens_per_s=0, eos_probability=0)

    async def one(i: int) -> StreamResult:
        t0 = time.perf_counter()
        ttft = None
        count = 0
        ended = False
        async for item in adapter.stream(_request(i, tokens)):
            if isinstance(item, Token):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                count += 1
            elif isinstance(item, Finish):
                ended = True
        return StreamResult(count, ttft, ended)

    m0, c0 = machine_busy_s(), time.process_time()
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - t0
    m1, c1 = machine_busy_s(), time.process_time()
    return make_round(
        list(results), wall, tokens, None, c1 - c0, None if m0 is None or m1 is None else m1 - m0
    )


# --------------------------------------------------------------------------------------------
# Servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], port: int, log_path: Path
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.cwd = ROOT  # the checkout whose code runs (``-m`` imports from the cwd first)
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, timeout_s: float = 60.0, probe: str = "/healthz") -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        _children.append(self.proc)
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.base_url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(probe)).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")

    def cpu_s(self) -> float | None:
        """utime + stime of the server process, from /proc."""
        if self.proc is None:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def preemptions(self) -> int | None:
        """Times the server process was switched out while it could run (another process
        took its core), from /proc."""
        if self.proc is None:
            return None
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("nonvoluntary_ctxt_switches:"):
                return int(line.split(":", 1)[1])
        return None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    async def stop(self, grace_s: float = 15.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.to_thread(proc.wait, 5)


class OtlpSink:
    """An OTLP/HTTP traces endpoint in this process (its own thread): answers every export
    and counts the spans (decoded when the OpenTelemetry protos are installed)."""

    def __init__(self) -> None:
        self.spans = 0
        self.requests = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sink.keep(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def keep(self, body: bytes) -> None:
        self.requests += 1
        try:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                ExportTraceServiceRequest,
            )
        except ImportError:
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.spans += sum(
            len(scope.spans) for res in request.resource_spans for scope in res.scope_spans
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def server_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATORD_")}
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.update(extra)
    return env


class Clients:
    """One ``httpx.AsyncClient`` per stream (stream ``i`` always uses ``clients[i]``).

    A single shared client is not used on purpose: httpcore's connection pool rescans every
    queued request against every connection on each change, so with ~50 concurrent streams
    on one pool the client itself serializes the streams' starts (measured: the 50th request
    reached the bare relay ~1 s after it was issued, against ~0.1 s with one client per
    stream). One client per stream keeps one warm keep-alive connection per stream.
    """

    def __init__(self, streams: int, timeout_s: float) -> None:
        timeout = httpx.Timeout(timeout_s, connect=10.0)
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self.per_stream = [
            httpx.AsyncClient(timeout=timeout, limits=limits) for _ in range(streams)
        ]
        self.control = httpx.AsyncClient(timeout=timeout)

    def __getitem__(self, i: int) -> httpx.AsyncClient:
        return self.per_stream[i % len(self.per_stream)]

    async def __aenter__(self) -> Clients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in [*self.per_stream, self.control]:
            await c.aclose()


def make_client(streams: int, timeout_s: float) -> Clients:
    return Clients(streams, timeout_s)


# --------------------------------------------------------------------------------------------
# Scenario drivers

StartOne = Callable[[int], Awaitable[StreamResult]]


async def timed_round(
    server: Server, streams: int, tokens: int, start_one: StartOne, timeout_s: float
) -> Round:
    m0, s0, c0 = machine_busy_s(), server.cpu_s(), time.process_time()
    t0 = time.perf_counter()
    results = await asyncio.wait_for(
        asyncio.gather(*(start_one(i) for i in range(streams))), timeout_s
    )
    wall = time.perf_counter() - t0
    m1, s1, c1 = machine_busy_s(), server.cpu_s(), time.process_time()
    server_cpu = None if s0 is None or s1 is None else s1 - s0
    return make_round(
        list(results),
        wall,
        tokens,
        server_cpu,
        c1 - c0,
        None if m0 is None or m1 is None else m1 - m0,
    )


async def bench_bare(args: argparse.Namespace, flush: int, workdir: Path) -> Scenario:
    sc = Scenario(name=f"bare relay (flush{flush})", kind="bare")
    port = free_port()
    server = Server(
        sc.name,
        [
            sys.executable,
            str(HERE / "bare_relay.py"),
            "--port",
            str(port),
            "--log-level",
            args.server_log_level,
        ],
        server_env({}),
        port,
        workdir / f"bare_flush{flush}.log",
    )
    try:
        await server.start()
        async with make_client(args.streams, args.round_timeout) as clients:

            def start_one_for(tokens: int, tag: str) -> StartOne:
                async def one(i: int) -> StreamResult:
                    url = (
                        f"{server.base_url}/stream?max_tokens={tokens}&seed={i}"
                        f"&prompt=bench%20stream%20{i}&flush={flush}&id={tag}-{i}"
                    )
                    return await consume_sse(clients[i], url, time.perf_counter())

                return one

            await timed_round(
                server,
                args.streams,
                args.warmup_tokens,
                start_one_for(args.warmup_tokens, "warm"),
                args.round_timeout,
            )
            for r in range(args.repeat):
                sc.rounds.append(
                    await timed_round(
                        server,
                        args.streams,
                        args.tokens,
                        start_one_for(args.tokens, f"r{r}"),
                        args.round_timeout,
                    )
                )
                print(f"  {sc.name} round {r + 1}: {fmt_round(sc.rounds[-1])}", flush=True)
            probe = start_one_for(IDLE_PROBE_TOKENS, "idle")
            for i in range(IDLE_PROBES):
                res = await asyncio.wait_for(probe(i), args.round_timeout)
                if res.ttft_s is not None:
                    sc.idle_ttft_ms.append(res.ttft_s * 1000)
    except Exception as exc:
        sc.errors.append(f"{type(exc).__name__}: {exc}")
        print(f"  {sc.name} FAILED: {exc}\n{server.log_tail()}", flush=True)
    finally:
        await server.stop()
    return sc


class OrchestratordBench:
    """One orchestratord server and its clients, measured round by round, so that two
    servers (tracing off and on) can take turns and share the machine's drift."""

    def __init__(
        self,
        args: argparse.Namespace,
        name: str,
        database_url: str,
        workdir: Path,
        *,
        sink: OtlpSink | None = None,
    ) -> None:
        self.args = args
        self.sc = Scenario(name=name, kind="orchestratord")
        self.sink = sink
        self.spans_before = sink.spans if sink else 0
        port = free_port()
        env = server_env(
            {
                "ORCHESTRATORD_SIM__TOKENS_PER_S": "0",
                "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
                "ORCHESTRATORD_SIM__SLOTS": str(max(64, args.streams)),
                "ORCHESTRATORD_LOG_LEVEL": args.server_log_level,
                **({"ORCHESTRATORD_TRACING__OTLP_ENDPOINT": sink.url} if sink else {}),
            }
        )
        exe = VENV_BIN / "orchestratord"
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestratord.cli"]
        argv += [
            "serve",
            "--engine",
            "sim",
            "--database-url",
            database_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        slug = name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
        self.server = Server(name, argv, env, port, workdir / f"{slug}.log")
        self.clients: Clients | None = None
        self.flow_id = ""
        self.probe_run = ""

    async def guarded(self, phase: Coroutine[Any, Any, None]) -> None:
        """Run one phase; a failure is recorded and ends this scenario's measurements."""
        if self.sc.errors:
            phase.close()
            return
        try:
            await phase
        except Exception as exc:
            self.sc.errors.append(f"{type(exc).__name__}: {exc}")
            print(f"  {self.sc.name} FAILED: {exc}\n{self.server.log_tail()}", flush=True)

    async def start(self) -> None:
        await self.server.start()
        self.clients = make_client(self.args.streams, self.args.round_timeout)
        r = await self.clients.control.post(
            f"{self.server.base_url}/v1/flows", json={"ast": {"v": 1, "bench": "relay"}}
        )
        r.raise_for_status()
        self.flow_id = r.json()["flow_id"]

    async def new_run(self, seed: int) -> str:
        assert self.clients is not None
        r = await self.clients.control.post(
            f"{self.server.base_url}/v1/flows/{self.flow_id}/runs", json={"seed": seed}
        )
        r.raise_for_status()
        run_id: str = r.json()["run_id"]
        return run_id

    async def step(self, i: int, run_id: str, tokens: int, tag: str) -> StreamResult:
        """POST a step, follow its stream to the end; TTFT from the POST."""
        assert self.clients is not None
        base, client = self.server.base_url, self.clients[i]
        t0 = time.perf_counter()
        resp = await client.post(
            f"{base}/v1/runs/{run_id}/steps",
            json={
                "type": "llm_call",
                "client_token": f"{tag}-{i}-{uuid.uuid4().hex}",
                "input": {"prompt": f"bench stream {i}", "params": {"max_tokens": tokens}},
            },
        )
        if resp.status_code not in (200, 202):
            raise RuntimeError(f"step POST: {resp.status_code} {resp.text[:200]}")
        step_id = resp.json()["step_id"]
        return await consume_sse(client, f"{base}/v1/steps/{step_id}/stream", t0)

    async def round(self, tokens: int, tag: str, *, keep: bool = True) -> None:
        args = self.args
        # Runs are created before the clock starts: one per stream, or one shared.
        if args.shared_run:
            run_ids = [await self.new_run(1)] * args.streams
        else:
            run_ids = [await self.new_run(i + 1) for i in range(args.streams)]

        async def one(i: int) -> StreamResult:
            return await self.step(i, run_ids[i], tokens, tag)

        measured = await timed_round(self.server, args.streams, tokens, one, args.round_timeout)
        if keep:
            self.sc.rounds.append(measured)
            n = len(self.sc.rounds)
            print(f"  {self.sc.name} round {n}: {fmt_round(measured)}", flush=True)

    async def start_probes(self) -> None:
        self.probe_run = await self.new_run(99)

    async def idle_probe(self) -> None:
        """One stream on an otherwise idle server."""
        res = await asyncio.wait_for(
            self.step(0, self.probe_run, IDLE_PROBE_TOKENS, "idle"), self.args.round_timeout
        )
        if res.ttft_s is not None:
            self.sc.idle_ttft_ms.append(res.ttft_s * 1000)

    async def stop(self) -> Scenario:
        if self.clients is not None:
            await self.clients.__aexit__()
        await self.server.stop()  # SIGINT: a traced server exports its last spans first
        if self.sink is not None:
            self.sc.spans_exported = self.sink.spans - self.spans_before
            print(f"  {self.sc.name}: {self.sc.spans_exported} spans exported", flush=True)
        return self.sc


async def bench_orchestratord(benches: list[OrchestratordBench]) -> list[Scenario]:
    """Each server started and warmed up; then every measured round, and every idle probe,
    taken by each server in turn."""
    args = benches[0].args
    try:
        for b in benches:
            await b.guarded(b.start())
        for b in benches:
            await b.guarded(b.round(args.warmup_tokens, "warm", keep=False))
        for r_i in range(args.repeat):
            for b in benches:
                await b.guarded(b.round(args.tokens, f"r{r_i}"))
        for b in benches:
            await b.guarded(b.start_probes())
        for _ in range(IDLE_PROBES):
            for b in benches:
                await b.guarded(b.idle_probe())
    finally:
        scenarios = [await b.stop() for b in benches]
    return scenarios


async def bench_direct(args: argparse.Namespace) -> Scenario:
    sc = Scenario(name="direct (in-process sim)", kind="direct")
    await direct_round(args.streams, args.warmup_tokens)
    for r in range(args.repeat):
        sc.rounds.append(await direct_round(args.streams, args.tokens))
        print(f"  {sc.name} round {r + 1}: {fmt_round(sc.rounds[-1])}", flush=True)
    return sc


class PgDatabase:
    """A fresh PostgreSQL database for one scenario, dropped afterwards."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"orch_bench_{uuid.uuid4().hex[:12]}"
        self.url = f"{admin_url.rsplit('/', 1)[0]}/{self.name}"

    async def __aenter__(self) -> str:
        import asyncpg

        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            await conn.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await conn.close()
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await conn.close()


# --------------------------------------------------------------------------------------------
# Report


def fmt_round(r: Round) -> str:
    p50 = "-" if r.ttft_p50_ms is None else f"{r.ttft_p50_ms:.1f}"
    p95 = "-" if r.ttft_p95_ms is None else f"{r.ttft_p95_ms:.1f}"
    srv = "" if r.server_cpu_s is None else f", server cpu {r.server_cpu_s:.2f}s"
    return (
        f"{r.delivered_tok_s:,.0f} tok/s, wall {r.wall_s:.2f}s, TTFT p50 {p50} ms "
        f"p95 {p95} ms, {r.ok_streams} complete streams{srv}, "
        f"client cpu {r.client_cpu_s:.2f}s"
    )


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown_table(summaries: dict[str, dict[str, Any]], direct_name: str) -> str:
    direct = summaries.get(direct_name, {}).get("delivered_tok_s")
    lines = [
        "| scenario | delivered tok/s | % of direct | TTFT p50 ms | TTFT p95 ms "
        "| idle TTFT p50 ms | server CPU µs/token | server CPU ms/step | client CPU µs/token "
        "| other CPU s | complete |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for name, s in summaries.items():
        pct = (
            None
            if not direct or s["delivered_tok_s"] is None
            else 100 * s["delivered_tok_s"] / direct
        )
        lines.append(
            f"| {name} | {_num(s['delivered_tok_s'], ',.0f')} | {_num(pct, '.1f')} "
            f"| {_num(s['ttft_p50_ms'], '.2f')} | {_num(s['ttft_p95_ms'], '.2f')} "
            f"| {_num(s['idle_ttft_p50_ms'], '.2f')} "
            f"| {_num(s['server_cpu_us_per_token'], '.1f')} "
            f"| {_num(s['server_cpu_ms_per_step'], '.2f')} "
            f"| {_num(s['client_cpu_us_per_token'], '.1f')} "
            f"| {_num(s['other_cpu_s'], '.2f')} "
            f"| {'yes' if s['all_streams_complete'] else 'NO'} |"
        )
    return "\n".join(lines)


def comparisons(
    summaries: dict[str, dict[str, Any]], bare_name: str, orch_names: list[str]
) -> list[dict[str, Any]]:
    bare = summaries.get(bare_name)
    out = []
    for name in orch_names:
        orch = summaries.get(name)
        if (
            not bare
            or not orch
            or bare["delivered_tok_s"] in (None, 0)
            or orch["delivered_tok_s"] is None
        ):
            continue
        ratio = orch["delivered_tok_s"] / bare["delivered_tok_s"]
        added = (
            None
            if orch["ttft_p50_ms"] is None or bare["ttft_p50_ms"] is None
            else orch["ttft_p50_ms"] - bare["ttft_p50_ms"]
        )
        idle_added = (
            None
            if orch["idle_ttft_p50_ms"] is None or bare["idle_ttft_p50_ms"] is None
            else orch["idle_ttft_p50_ms"] - bare["idle_ttft_p50_ms"]
        )
        out.append(
            {
                "scenario": name,
                "baseline": bare_name,
                "delivered_ratio": ratio,
                "delivered_ratio_target": TARGET_RATIO,
                "delivered_ratio_met": ratio >= TARGET_RATIO,
                "added_ttft_p50_ms": added,
                "added_ttft_p50_target_ms": TARGET_ADDED_TTFT_MS,
                "added_ttft_p50_met": added is not None and added < TARGET_ADDED_TTFT_MS,
                "idle_added_ttft_p50_ms": idle_added,
            }
        )
    return out


def machine_info() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    load = ""
    with contextlib.suppress(OSError):
        load = Path("/proc/loadavg").read_text().strip()
    return {
        "loadavg_at_start": load,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "memory": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def git_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty_files": [ln for ln in git("status", "--porcelain").splitlines() if ln],
    }


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in (
        "uvicorn",
        "starlette",
        "fastapi",
        "httpx",
        "sqlalchemy",
        "aiosqlite",
        "asyncpg",
        "orjson",
        "uvloop",
        "httptools",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# --------------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    scenarios: list[Scenario] = []
    tracing = {"off": [False], "on": [True], "both": [False, True]}[args.tracing]
    sink = OtlpSink() if True in tracing else None
    try:
        if not args.only_orchestratord:
            print(f"direct: {args.streams} streams x {args.tokens} tokens", flush=True)
            scenarios.append(await bench_direct(args))
            print("bare relay", flush=True)
            scenarios.append(await bench_bare(args, 16, workdir))
            if args.per_frame:
                scenarios.append(await bench_bare(args, 1, workdir))
        sqlite = [
            OrchestratordBench(
                args,
                f"orchestratord (SQLite{', tracing on' if traced else ''})",
                f"sqlite:///{workdir}/orchestratord{'-traced' if traced else ''}.db",
                workdir,
                sink=sink if traced else None,
            )
            for traced in tracing
        ]
        print(", ".join(b.sc.name for b in sqlite), flush=True)
        scenarios += await bench_orchestratord(sqlite)
        if args.pg:
            names = [f"orchestratord (PostgreSQL{', tracing on' if t else ''})" for t in tracing]
            print(", ".join(names), flush=True)
            try:
                async with contextlib.AsyncExitStack() as stack:
                    pg = [
                        OrchestratordBench(
                            args,
                            name,
                            await stack.enter_async_context(PgDatabase(args.pg_admin_url)),
                            workdir,
                            sink=sink if traced else None,
                        )
                        for name, traced in zip(names, tracing, strict=True)
                    ]
                    scenarios += await bench_orchestratord(pg)
            except Exception as exc:
                for name in names:
                    sc = Scenario(name=name, kind="orchestratord")
                    sc.errors.append(f"{type(exc).__name__}: {exc}")
                    scenarios.append(sc)
                print(f"  PostgreSQL scenarios failed: {exc}", flush=True)
    finally:
        if sink is not None:
            sink.close()
        if args.keep_logs:
            print(f"server logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    summaries = {sc.name: sc.summary(args.streams) for sc in scenarios}
    orch_names = [sc.name for sc in scenarios if sc.kind == "orchestratord"]
    # The primary baseline is flush16; flush1 (a weaker relay) is kept for reference.
    comps = comparisons(summaries, "bare relay (flush16)", orch_names) + comparisons(
        summaries, "bare relay (flush1)", orch_names
    )
    return {
        "benchmark": "relay",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([".venv/bin/python", "bench/relay.py", *sys.argv[1:]]),
        "config": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k != "pg_admin_url"
        },
        "machine": machine_info(),
        "versions": versions(),
        "git": git_state(),
        "note": args.note,
        "targets": {
            "delivered_ratio_min": TARGET_RATIO,
            "added_ttft_p50_ms_max": TARGET_ADDED_TTFT_MS,
        },
        "summary": summaries,
        "comparisons": comps,
        "scenarios": [
            {
                "name": sc.name,
                "kind": sc.kind,
                "errors": sc.errors,
                "spans_exported": sc.spans_exported,
                "idle_ttft_ms": sc.idle_ttft_ms,
                "rounds": [asdict(r) for r in sc.rounds],
            }
            for sc in scenarios
        ],
    }


def print_report(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print()
    print(
        f"### relay: {cfg['streams']} streams x {cfg['tokens']} tokens, "
        f"median of {cfg['repeat']} rounds ({result['machine']['cpus_usable']} CPUs)"
    )
    print()
    print(markdown_table(result["summary"], "direct (in-process sim)"))
    print()
    for c in result["comparisons"]:
        added = c["added_ttft_p50_ms"]
        idle = c["idle_added_ttft_p50_ms"]
        print(
            f"- {c['scenario']} / {c['baseline']}: delivered ratio {c['delivered_ratio']:.3f} "
            f"(target >= {c['delivered_ratio_target']}: "
            f"{'met' if c['delivered_ratio_met'] else 'MISSED'}); added TTFT p50 "
            f"{_num(added, '.2f')} ms (target < {c['added_ttft_p50_target_ms']} ms: "
            f"{'met' if c['added_ttft_p50_met'] else 'MISSED'}); idle added TTFT p50 "
            f"{_num(idle, '.2f')} ms"
        )
    for sc in result["scenarios"]:
        for err in sc["errors"]:
            print(f"- ERROR in {sc['name']}: {err}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--streams", type=int, default=50, help="concurrent streams (default 50)")
    p.add_argument("--tokens", type=int, default=2000, help="tokens per stream (default 2000)")
    p.add_argument("--repeat", type=int, default=3, help="measured rounds; the median is kept")
    p.add_argument(
        "--warmup-tokens",
        type=int,
        default=200,
        help="tokens per stream of the warm-up round (default 200)",
    )
    p.add_argument("--pg", action="store_true", help="also run orchestratord on PostgreSQL")
    p.add_argument(
        "--pg-admin-url",
        default=os.environ.get(
            "BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="database used to CREATE/DROP the scratch database",
    )
    p.add_argument(
        "--shared-run",
        action="store_true",
        help="all steps of a round in one run (default: one run per stream)",
    )
    p.add_argument(
        "--no-per-frame",
        dest="per_frame",
        action="store_false",
        help="skip the bare relay variant that writes every frame alone",
    )
    p.add_argument(
        "--server-log-level",
        default="info",
        help="log level of both servers (default info, orchestratord's default)",
    )
    p.add_argument(
        "--round-timeout",
        type=float,
        default=300.0,
        help="seconds one round may take before it is abandoned",
    )
    p.add_argument(
        "--tracing",
        choices=("off", "on", "both"),
        default="off",
        help="orchestratord with OpenTelemetry tracing to a local OTLP receiver: off (default), "
        "on, or both (each orchestratord scenario off, then on)",
    )
    p.add_argument(
        "--only-orchestratord",
        action="store_true",
        help="skip the direct and bare relay scenarios",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the servers' logs")
    p.add_argument("--note", default="", help="free text stored in the JSON (e.g. the commit)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "relay.json")
    args = p.parse_args(argv)
    if args.streams < 1 or args.tokens < 1 or args.repeat < 1 or args.warmup_tokens < 1:
        p.error("--streams, --tokens, --repeat and --warmup-tokens must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_report(result)
    print(f"\nresults written to {args.out}")
    ok = all(s["all_streams_complete"] for s in result["summary"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
