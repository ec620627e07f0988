"""Idle stream followers: server CPU and memory while N run streams wait for events.

The server runs in its own process (``orchestratord serve --engine sim``, a fresh SQLite
file, or ``--pg``). The client opens ``--streams`` connections with raw asyncio sockets
(cheap on the client side), each a ``GET /v1/runs/{id}/stream`` of its own idle run, waits
until every stream has its response headers, then measures the server process over
``--seconds``: CPU time used (utime + stime from /proc) as a share of one core, and its
resident memory per stream (RSS after - RSS before the streams, / streams).

    .venv/bin/python bench/idle_followers.py [--streams 1000] [--seconds 10] [--pg]

Writes ``bench/results/idle_followers.json`` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.relay import CLK_TCK, PgDatabase, Server, free_port, server_env


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def open_stream(port: int, run_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = f"GET /v1/runs/{run_id}/stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream"
    writer.write(request.encode() + b"\r\n\r\n")
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")  # the headers: the follower is in place
    return reader, writer


async def measure(
    database_url: str, streams: int, seconds: float, tmp: str, tree: Path | None = None
) -> dict[str, Any]:
    """``tree``: the checkout whose server runs (this one by default)."""
    port = free_port()
    argv = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim"]
    argv += ["--port", str(port), "--database-url", database_url]
    env = server_env({})
    server = Server("orchestratord", argv, env, port, Path(tmp) / "server.log")
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        server.cwd = tree
    await server.start(timeout_s=120)
    assert server.proc is not None
    pid = server.proc.pid
    held = []
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            flow = (await client.post("/v1/flows", json={"ast": {"idle": 1}})).json()["flow_id"]
            runs = [
                (await client.post(f"/v1/flows/{flow}/runs", json={})).json()["run_id"]
                for _ in range(streams)
            ]
        await asyncio.sleep(1.0)
        rss_before = rss_kib(pid)
        for i in range(0, streams, 100):
            held += await asyncio.gather(*(open_stream(port, r) for r in runs[i : i + 100]))
        await asyncio.sleep(2.0)  # settle
        cpu0, t0 = cpu_s(pid), time.monotonic()
        await asyncio.sleep(seconds)
        cpu1, t1 = cpu_s(pid), time.monotonic()
        rss_after = rss_kib(pid)
    finally:
        for _, w in held:
            w.close()
        await server.stop()
    return {
        "streams": streams,
        "seconds": round(t1 - t0, 2),
        "server_cpu_share_of_a_core": round((cpu1 - cpu0) / (t1 - t0), 4),
        "rss_kib_per_stream": round((rss_after - rss_before) / streams, 1),
        "rss_mib_total": round(rss_after / 1024, 1),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = await measure(f"sqlite:///{tmp}/b.db", args.streams, args.seconds, tmp)
        print("sqlite", out["sqlite"], flush=True)
        if args.pg:
            async with PgDatabase(args.pg_url) as url:
                out["postgresql"] = await measure(url, args.streams, args.seconds, tmp)
                print("postgresql", out["postgresql"], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pg", action="store_true")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "idle_followers.json")
    )
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
