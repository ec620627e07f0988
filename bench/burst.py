"""The loaded row of ``bench/latency.py`` alone, many bursts, each beside the direct engine.

One orchestratord server (``--pg``: on a fresh PostgreSQL database, else a SQLite file) with
an ``openai`` pool on the fake engine; ``--rounds`` bursts of ``--streams`` concurrent
streams x ``--tokens`` tokens, each followed by the same burst read from the engine directly.
Per burst: TTFT p99 through the server and direct; over all bursts: their medians, the added
time, and (medians, within each burst) the server's CPU, PostgreSQL's processes' CPU and how
often the server was switched out while it could run (what a loaded machine makes it wait
for). Each burst follows a warm-up round of 4-token streams, as in ``bench/latency.py``.

    .venv/bin/python bench/burst.py [--pg] [--one-request] [--tokens 200] [--rounds 9]
        [--against /path/to/other/checkout]

``--against``: a second server, from that checkout (on its own database), its bursts
interleaved with this one's (A/B on the machine's same minutes).
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


async def _side(
    a: argparse.Namespace, name: str, url: str, tree: Path, env: dict[str, str], tmp: Path
) -> tuple[latency.Target, Any]:
    pools = ["--pools", str(tmp / "pools.yaml")]
    server = await latency.start_orchestratord(name, url, pools, env, tmp, tree)
    runs = await latency.make_runs(server.base_url, a.streams)
    stream = latency.orchestrated_stream(server.base_url, runs, one_request=a.one_request)
    return latency.Target(name, stream, server), server


def _figures(rows: list[dict[str, float]], beside: list[float]) -> dict[str, Any]:
    through = [r["ttft_p99_ms"] for r in rows]
    return {
        "orchestratord_p99_ms": through,
        "added_p99_ms": statistics.median(through) - statistics.median(beside),
        # within each measured burst (not its warm-up round), median over the bursts
        "server_cpu_ms": 1000 * statistics.median(r["cpu_s"] for r in rows),
        "postgres_cpu_ms": 1000 * statistics.median(r["postgres_cpu_s"] for r in rows),
        "server_switched_out": statistics.median(r["server_preemptions"] for r in rows),
        "client_cpu_ms": 1000 * statistics.median(r["client_cpu_s"] for r in rows),
        # from the burst's start to its p99 first token: the machine's busy cores (of 2) and
        # the client's CPU in that window
        **_window(rows),
    }


def _window(rows: list[dict[str, float]]) -> dict[str, float]:
    if not all(k in r for r in rows for k in latency.TO_P99):
        return {}
    return {k: statistics.median(r[k] for r in rows) for k in latency.TO_P99}


async def bursts(a: argparse.Namespace, urls: list[str], upstream: str, tmp: Path) -> Any:
    """One server per URL (this checkout's, then ``--against``'s), bursts interleaved."""
    env = latency.write_pools(tmp, upstream, max(64, a.streams))
    trees = [ROOT] + ([Path(a.against).resolve()] if a.against else [])
    sides = []
    try:
        for tree, url in zip(trees, urls, strict=True):
            sides.append(await _side(a, str(tree), url, tree, env, tmp))
        direct = latency.Target("direct", latency.direct_stream(upstream), None)
        for target, _ in sides:
            await latency.concurrent(target, a.streams, a.tokens)  # warm: the runs read once
        rows: list[list[dict[str, float]]] = [[] for _ in sides]
        direct_rows: list[dict[str, float]] = []
        for _ in range(a.rounds):
            for i, (target, _) in enumerate(sides):
                rows[i].append(await latency.concurrent(target, a.streams, a.tokens))
            direct_rows.append(await latency.concurrent(direct, a.streams, a.tokens))
        beside = [r["ttft_p99_ms"] for r in direct_rows]
        out: dict[str, Any] = {"direct_p99_ms": beside}
        out.update({f"direct: {k}": v for k, v in _window(direct_rows).items()})
        out["direct: client_cpu_ms"] = 1000 * statistics.median(
            r["client_cpu_s"] for r in direct_rows
        )
        for (target, _), side_rows in zip(sides, rows, strict=True):
            figures = _figures(side_rows, beside)
            if len(sides) == 1:
                return {**figures, **out}
            out.update({f"{target.name}: {k}": v for k, v in figures.items()})
        return out
    finally:
        for _, server in sides:
            await server.stop()


async def main_async(a: argparse.Namespace) -> Any:
    tmp = Path(tempfile.mkdtemp())
    fake, upstream = await latency.start_engine(tmp)
    n = 2 if a.against else 1
    try:
        if not a.pg:
            urls = [f"sqlite:///{tmp / f'orch{i}.db'}" for i in range(n)]
            return await bursts(a, urls, upstream, tmp)
        async with PgDatabase(a.pg_url) as first:
            if n == 1:
                return await bursts(a, [first], upstream, tmp)
            async with PgDatabase(a.pg_url) as second:
                return await bursts(a, [first, second], upstream, tmp)
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
    ap.add_argument("--against", help="another checkout: its server's bursts interleaved")
    a = ap.parse_args()
    out = asyncio.run(main_async(a))
    for key, value in out.items():
        shown = [round(v) for v in value] if isinstance(value, list) else round(value, 1)
        print(f"{key}: {shown}")


if __name__ == "__main__":
    main()
