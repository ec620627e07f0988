"""The loaded row of ``bench/latency.py`` alone, many bursts, each beside the direct engine.

One orchestratord server (``--pg``: on a fresh PostgreSQL database, else a SQLite file) with
an ``openai`` pool on the fake engine; ``--rounds`` bursts of ``--streams`` concurrent
streams x ``--tokens`` tokens, each followed by the same burst read from the engine directly.
Per burst: TTFT p99 through the server and direct; over all bursts: their medians, the added
time, and (medians, within each burst) the server's CPU, PostgreSQL's processes' CPU and how
often the server was switched out while it could run (what a loaded machine makes it wait
for). Each burst follows a warm-up round of 4-token streams, as in ``bench/latency.py``.

    .venv/bin/python bench/burst.py [--pg] [--one-request] [--tokens 200] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import latency  # noqa: E402
from bench.relay import PgDatabase  # noqa: E402


async def bursts(a: argparse.Namespace, url: str, upstream: str, tmp: Path) -> Any:
    env = latency.write_pools(tmp, upstream, max(64, a.streams))
    pools = ["--pools", str(tmp / "pools.yaml")]
    server = await latency.start_orchestratord("orchestratord", url, pools, env, tmp)
    try:
        runs = await latency.make_runs(server.base_url, a.streams)
        stream = latency.orchestrated_stream(server.base_url, runs, one_request=a.one_request)
        target = latency.Target("orchestratord", stream, server)
        direct = latency.Target("direct", latency.direct_stream(upstream), None)
        await latency.concurrent(target, a.streams, a.tokens)  # warm: the runs read once
        rows: list[dict[str, float]] = []
        beside: list[float] = []
        for _ in range(a.rounds):
            rows.append(await latency.concurrent(target, a.streams, a.tokens))
            beside.append((await latency.concurrent(direct, a.streams, a.tokens))["ttft_p99_ms"])
        through = [r["ttft_p99_ms"] for r in rows]
        return {
            "orchestratord_p99_ms": through,
            "direct_p99_ms": beside,
            "added_p99_ms": statistics.median(through) - statistics.median(beside),
            # within each measured burst (not its warm-up round), median over the bursts
            "server_cpu_ms": 1000 * statistics.median(r["cpu_s"] for r in rows),
            "postgres_cpu_ms": 1000 * statistics.median(r["postgres_cpu_s"] for r in rows),
            "server_switched_out": statistics.median(r["server_preemptions"] for r in rows),
        }
    finally:
        await server.stop()


async def main_async(a: argparse.Namespace) -> Any:
    tmp = Path(tempfile.mkdtemp())
    fake, upstream = await latency.start_engine(tmp)
    try:
        if not a.pg:
            return await bursts(a, f"sqlite:///{tmp / 'orch.db'}", upstream, tmp)
        async with PgDatabase(a.pg_url) as url:
            return await bursts(a, url, upstream, tmp)
    finally:
        await fake.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pg", action="store_true")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--one-request", action="store_true", help="submit and follow in one request")
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    out = asyncio.run(main_async(a))
    for key, value in out.items():
        shown = [round(v) for v in value] if isinstance(value, list) else round(value, 1)
        print(f"{key}: {shown}")


if __name__ == "__main__":
    main()
