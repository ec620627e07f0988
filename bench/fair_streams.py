"""Fair streams: control requests while hundreds of SSE streams catch up on long runs.

One ``orchestratord serve --engine sim`` process per measurement (its own process, a copy of
one filled database: a SQLite file, or with ``--pg`` a PostgreSQL database made from a
template). The database is filled once, before anything is measured: ``--runs`` runs, each
one step of ``--tokens`` tokens on the fast sim (about 7,700 events with its ``started``,
narration, metrics and ``end``), then completed (``run_end``), and one idle run for the probe's
steps.

A measurement:

* a **probe** process of its own (``--probe``) asks ``GET /v1/pools`` and submits a one-token
  step (``POST /v1/runs/{id}/steps``, 201 once stored) in turns, every ``--every-ms``, over
  one keep-alive connection each, and times each answer;
* after ``--quiet-s`` of that on the idle server, this process opens ``--streams`` raw HTTP
  connections at once, each ``GET /v1/runs/{id}/stream`` of one of the runs from its start
  (stream ``i`` on run ``i % runs``; ``--follow steps``: the runs' steps' streams instead),
  and reads each to its ``run_end`` (``end``), checking that the events it counted are
  exactly the stream's (ids 0..N, none missing, none twice); ``--stalled`` more connections
  ask for a stream and never read a byte (a 4 KiB receive window);
* once every reading stream has its end the probe stops. Its answers that overlap the
  catch-up give p50/p99/max per request kind (the quiet ones beside them, and when the three
  slowest were sent); "catch-up s" is the time from the first stream's request to the last
  end; the server's CPU (user + system) over the same span, and its peak RSS.

With ``--trees A B`` each round measures a server of checkout A, then one of checkout B, on
copies of the same database (an A/B in one sitting; every figure is the median over
``--rounds``). ``--py-spy PREFIX`` records each server's stacks during the catch-up (py-spy's
raw format, ``PREFIX.<tree>.<n>``; ``pip install py-spy`` into the venv).

    .venv/bin/python bench/fair_streams.py [--streams 500] [--runs 50] [--tokens 7680] [--pg]
        [--stalled 0] [--follow runs|steps] [--trees /tmp/before .] [--rounds 3]

Writes ``bench/results/fair_streams.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.relay import CLK_TCK, PgDatabase, Server, free_port, server_env  # noqa: E402


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 2),
        "p99_ms": round(pct(values, 99), 2),
        "max_ms": round(max(values), 2),
    }


def cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):  # the peak
            return int(line.split()[1]) / 1024
    return 0.0


# --------------------------------------------------------------------------------------------
# The probe (its own process: its timings are not held up by this process's 500 readers)


async def probe_main(base: str, run_id: str, every_ms: float, out: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    samples: list[tuple[float, str, float, int]] = []  # (sent at, kind, ms, status)
    timeout = httpx.Timeout(120, connect=10)
    async with (
        httpx.AsyncClient(base_url=base, timeout=timeout) as pools,
        httpx.AsyncClient(base_url=base, timeout=timeout) as steps,
    ):
        n = 0
        while not stop.is_set():
            t0 = time.monotonic()
            if n % 2 == 0:
                r = await pools.get("/v1/pools")
                kind = "pools"
            else:
                body = {
                    "type": "llm_call",
                    "client_token": f"probe-{uuid.uuid4().hex}",
                    "input": {"prompt": "probe", "params": {"max_tokens": 1}},
                }
                r = await steps.post(f"/v1/runs/{run_id}/steps", json=body)
                kind = "submit"
            samples.append((t0, kind, (time.monotonic() - t0) * 1000, r.status_code))
            n += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_ms / 1000)
    out.write_text(json.dumps(samples))


class Probe:
    def __init__(self, base: str, run_id: str, every_ms: float, tmp: Path) -> None:
        self.out = tmp / f"probe-{uuid.uuid4().hex[:8]}.json"
        argv = [sys.executable, __file__, "--probe", base, "--probe-run", run_id]
        argv += ["--every-ms", str(every_ms), "--probe-out", str(self.out)]
        self.proc = subprocess.Popen(argv, env=server_env({}), stdin=subprocess.DEVNULL)

    async def stop(self) -> list[tuple[float, str, float, int]]:
        self.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self.proc.wait, 180)
        samples: list[tuple[float, str, float, int]] = json.loads(self.out.read_text())
        return samples


# --------------------------------------------------------------------------------------------
# The streams: raw sockets, counted without parsing every frame (the client shares the cores)


async def read_stream(port: int, path: str) -> dict[str, Any]:
    """``path``: a run's stream (to its ``run_end``) or a step's (to its ``end``)."""
    last = b"event: run_end\n" if path.startswith("/v1/runs/") else b"event: end\n"
    last_id = re.compile(rb"id: (\d+)\n" + last)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream"
        writer.write(request.encode() + b"\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"stream {path}: {head[:80]!r}")
        count, carry, tail = 0, b"", b""
        while True:
            data = await reader.read(1 << 18)
            if not data:
                raise RuntimeError(f"stream {path} closed after {count} events, no end")
            joined = carry + data
            count += joined.count(b"\nevent: ")
            carry = joined[-7:]  # shorter than the marker: a match is never counted twice
            tail = (tail + data)[-4096:]
            if last in tail:
                break
        m = last_id.search(tail)
        assert m is not None
        return {"events": count, "last_id": int(m.group(1)), "done_at": time.monotonic()}
    finally:
        writer.close()


def stall_stream(port: int, path: str) -> socket.socket:
    """Asks for a stream and never reads (the kernel's buffers fill, then the server's)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream"
    sock.sendall(request.encode() + b"\r\n\r\n")
    return sock


# --------------------------------------------------------------------------------------------
# Filling the database once, with the working tree's server


def serve_argv(port: int, url: str) -> list[str]:
    return [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim", "--host",
            "127.0.0.1", "--port", str(port), "--database-url", url]  # fmt: skip


def server(url: str, tmp: Path, tree: Path, name: str) -> Server:
    port = free_port()
    env = server_env(
        {
            "ORCHESTRATORD_SIM__TOKENS_PER_S": "0",
            "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
            "ORCHESTRATORD_SIM__SLOTS": "64",
            "ORCHESTRATORD_LOG_LEVEL": "warning",
            "PYTHONPATH": str(tree),
        }
    )
    srv = Server(name, serve_argv(port, url), env, port, tmp / f"{name}.log")
    srv.cwd = tree
    return srv


async def fill(url: str, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    srv = server(url, tmp, ROOT, "fill")
    await srv.start(timeout_s=120)
    t0 = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=600) as c:
            flow = (await c.post("/v1/flows", json={"ast": {"bench": "fair_streams"}})).json()
            flow_id = flow["flow_id"]
            runs, steps = [], []
            for i in range(a.runs):
                r = await c.post(f"/v1/flows/{flow_id}/runs", json={"seed": i + 1})
                runs.append(r.json()["run_id"])
            probe_run = (await c.post(f"/v1/flows/{flow_id}/runs", json={"seed": 0})).json()

            async def one(run_id: str) -> None:
                body = {
                    "type": "llm_call",
                    "client_token": "long",
                    "input": {"prompt": "fill", "params": {"max_tokens": a.tokens}},
                }
                step = (await c.post(f"/v1/runs/{run_id}/steps", json=body)).json()
                steps.append(step["step_id"])
                while (await c.get(f"/v1/steps/{step['step_id']}")).json()["status"] in (
                    "queued",
                    "running",
                ):
                    await asyncio.sleep(0.5)
                done = await c.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
                done.raise_for_status()

            for i in range(0, len(runs), 16):
                await asyncio.gather(*(one(r) for r in runs[i : i + 16]))
    finally:
        await srv.stop()
    print(f"filled {a.runs} runs of {a.tokens} tokens in {time.monotonic() - t0:.1f} s")
    return {"runs": runs, "steps": steps, "probe_run": probe_run["run_id"]}


# --------------------------------------------------------------------------------------------
# One measurement


async def measure(
    url: str, tree: Path, made: dict[str, Any], a: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    srv = server(url, tmp, tree, f"serve-{uuid.uuid4().hex[:6]}")
    await srv.start(timeout_s=120)
    assert srv.proc is not None
    pid = srv.proc.pid
    if a.follow == "runs":
        paths = [f"/v1/runs/{r}/stream" for r in made["runs"]]
    else:
        paths = [f"/v1/steps/{s}/stream" for s in made["steps"]]
    held: list[socket.socket] = []
    try:
        probe = Probe(srv.base_url, made["probe_run"], a.every_ms, tmp)
        await asyncio.sleep(a.quiet_s)
        spy = None
        if a.py_spy:  # the server's stacks while the streams catch up (py-spy's raw format)
            argv = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid)]
            spied = f"{a.py_spy}.{tree.name or 'root'}.{len(list(Path(tmp).glob('serve-*.log')))}"
            argv += ["-r", "250", "-f", "raw", "-o", spied, "--nonblocking"]
            spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await asyncio.sleep(1.0)
        cpu0 = cpu_s(pid)
        t_open = time.monotonic()
        held += [stall_stream(srv.port, paths[i % len(paths)]) for i in range(a.stalled)]
        tasks = [
            asyncio.create_task(read_stream(srv.port, paths[i % len(paths)]))
            for i in range(a.streams)
        ]
        results = await asyncio.wait_for(asyncio.gather(*tasks), a.timeout_s)
        t_done = max(r["done_at"] for r in results)
        cpu1 = cpu_s(pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await asyncio.to_thread(spy.wait, 60)
        await asyncio.sleep(0.5)
        samples = await probe.stop()
        peak = rss_mib(pid)
    finally:
        for sock in held:
            sock.close()
        await srv.stop()
    bad = [r for r in results if r["events"] != r["last_id"] + 1]
    if bad:
        raise RuntimeError(f"{len(bad)} streams with a gap or a duplicate: {bad[:3]}")
    errors = [s for s in samples if s[3] >= 300]
    row: dict[str, Any] = {
        "catch_up_s": round(t_done - t_open, 2),
        "events_per_stream": statistics.median(r["events"] for r in results),
        "server_cpu_s": round(sum(cpu1) - sum(cpu0), 2),
        "server_sys_s": round(cpu1[1] - cpu0[1], 2),
        "server_peak_rss_mib": round(peak, 1),
        "probe_errors": len(errors),
    }
    for kind in ("pools", "submit"):
        # loaded: a request whose time overlaps the catch-up, however little
        quiet = [ms for t, k, ms, _ in samples if k == kind and t + ms / 1000 < t_open]
        loaded = [
            ms for t, k, ms, _ in samples if k == kind and t + ms / 1000 >= t_open and t < t_done
        ]
        row[f"{kind}_quiet"] = summary(quiet)
        row[f"{kind}_loaded"] = summary(loaded)
        worst = sorted(
            (s for s in samples if s[1] == kind and s[0] + s[2] / 1000 >= t_open and s[0] < t_done),
            key=lambda s: -s[2],
        )[:3]  # when the slowest were sent (s after the streams' first request), and took
        row[f"{kind}_worst"] = [(round(t - t_open, 2), round(ms, 1)) for t, _, ms, _ in worst]
    return row


def flat(row: dict[str, Any]) -> dict[str, float]:
    out = {k: v for k, v in row.items() if isinstance(v, int | float)}
    for kind in ("pools", "submit"):
        for stat in ("p50_ms", "p99_ms", "max_ms"):
            out[f"{kind}_{stat}"] = row[f"{kind}_loaded"].get(stat, float("nan"))
    return out


def copies(
    a: argparse.Namespace, tmp: Path, template: str, label: str
) -> contextlib.AbstractAsyncContextManager[str]:
    """A fresh copy of the filled database, as a context manager yielding its URL."""
    if label == "SQLite":
        path = tmp / f"{uuid.uuid4().hex}.db"
        src = Path(template.removeprefix("sqlite:///"))
        shutil.copyfile(src, path)
        for suffix in ("-wal", "-shm"):
            if Path(f"{src}{suffix}").exists():
                shutil.copyfile(f"{src}{suffix}", f"{path}{suffix}")
        return contextlib.nullcontext(f"sqlite:///{path}")  # an async one too
    return PgCopy(a.pg_url, template.rsplit("/", 1)[1])


class PgCopy(PgDatabase):
    def __init__(self, admin_url: str, template: str) -> None:
        super().__init__(admin_url)
        self.template = template

    async def __aenter__(self) -> str:
        import asyncpg

        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            await conn.execute(f'CREATE DATABASE "{self.name}" TEMPLATE "{self.template}"')
        finally:
            await conn.close()
        return self.url


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="fair-streams-"))
    trees = [Path(t).resolve() for t in (a.trees or [str(ROOT)])]
    out: dict[str, Any] = {"args": vars(a), "rounds": []}
    labels = ["SQLite", "PostgreSQL"] if a.pg else ["SQLite"]
    try:
        for label in labels:
            template_db: PgDatabase | None = None
            if label == "SQLite":
                template = f"sqlite:///{tmp / 'template.db'}"
            else:
                template_db = PgDatabase(a.pg_url)
                template = await template_db.__aenter__()
            try:
                made = await fill(template, a, tmp)
                for r in range(a.rounds):
                    for tree in trees:
                        async with copies(a, tmp, template, label) as url:
                            row = await measure(url, tree, made, a, tmp)
                        row = {"round": r, "tree": str(tree), "db": label, **row}
                        out["rounds"].append(row)
                        print(json.dumps(row), flush=True)
            finally:
                if template_db is not None:
                    await template_db.__aexit__()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    medians: dict[str, Any] = {}
    for label in labels:
        for tree in trees:
            rows = [flat(x) for x in out["rounds"] if x["db"] == label and x["tree"] == str(tree)]
            if rows:
                medians[f"{tree} {label}"] = {
                    k: statistics.median(x[k] for x in rows) for k in rows[0] if k != "round"
                }
    out["median"] = medians
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--stalled", type=int, default=0, help="more streams that never read")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument(
        "--follow",
        choices=["runs", "steps"],
        default="runs",
        help="the runs' or the steps' streams",
    )
    ap.add_argument("--tokens", type=int, default=7680, help="tokens of each run's one step")
    ap.add_argument("--every-ms", type=float, default=20.0, help="the probe's pace")
    ap.add_argument("--quiet-s", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--trees", nargs="*", help="checkouts whose servers take turns (A/B)")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--pg", action="store_true")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fair_streams.json"))
    ap.add_argument(
        "--py-spy", help="record each server's stacks during the catch-up (PREFIX.TREE.N)"
    )
    ap.add_argument("--probe", help=argparse.SUPPRESS)  # the probe process: the server's URL
    ap.add_argument("--probe-run", help=argparse.SUPPRESS)
    ap.add_argument("--probe-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.probe:
        asyncio.run(probe_main(a.probe, a.probe_run, a.every_ms, Path(a.probe_out)))
        return
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * (a.streams + a.stalled) + 1024
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(want, 4096)), hard))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    out = asyncio.run(main_async(a))
    Path(a.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
    for name, row in out["median"].items():
        print(name, json.dumps(row))


if __name__ == "__main__":
    main()
