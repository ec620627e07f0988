"""Several orchestratord processes on one PostgreSQL database: claims and cross-process streams.

**Claims**, with 1, 2 and 3 processes (``orchestratord serve --engine sim``, each with its
own 8-slot sim replica at full speed, one fresh database per round): the client submits
``--steps`` one-token steps, round-robin over the processes, ``--concurrency`` at a time, then
waits until every step has ended. From the database: claims per second = steps / (last
``started_at`` - first ``created_at``), and each step's claim latency = ``started_at`` -
``created_at`` (queued → claimed by some process), p50 and p99.

**Cross-process stream latency**, 2 processes: a paced step (``--tokens`` tokens at 50
tokens/s) runs on A; one client follows it on A and one on B. A token frame reaches A's
follower right after its commit (A's writer wakes its own followers in memory), and B's
follower after NOTIFY has woken B and B has read the log: the latency of a token is its
arrival on B - its arrival on A, p50 and p99 over every token.

    .venv/bin/python bench/scale_out.py [--steps 600] [--concurrency 32] [--tokens 200]

Writes ``bench/results/scale_out.json`` and prints it.
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

from bench.relay import PgDatabase, Server, free_port, percentile, server_env

ADMIN = os.environ.get("ORCHESTRATORD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


async def start_fleet(db_url: str, n: int, tmp: Path, **env: str) -> list[Server]:
    servers = []
    for i in range(n):  # one after the other: the first migrates the fresh database
        port = free_port()
        argv = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim"]
        argv += ["--port", str(port), "--database-url", db_url]
        extra = {"ORCHESTRATORD_INSTANCE": f"p{i}", "ORCHESTRATORD_LOG_LEVEL": "warning", **env}
        server = Server(f"p{i}", argv, server_env(extra), port, tmp / f"p{i}.log")
        await server.start(timeout_s=120)
        servers.append(server)
    return servers


async def new_run(c: httpx.AsyncClient) -> str:
    flow = (await c.post("/v1/flows", json={"ast": {"bench": "scale"}})).json()
    r = await c.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 1})
    return str(r.json()["run_id"])


async def submit(c: httpx.AsyncClient, run_id: str, token: str, max_tokens: int) -> str:
    r = await c.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": token,
            "input": {"prompt": token, "params": {"max_tokens": max_tokens}},
        },
    )
    r.raise_for_status()
    return str(r.json()["step_id"])


async def claims(processes: int, steps: int, concurrency: int, tmp: Path) -> dict[str, Any]:
    import asyncpg

    async with PgDatabase(ADMIN) as db_url:
        env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "0", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}
        fleet = await start_fleet(db_url, processes, tmp, **env)
        try:
            clients = [httpx.AsyncClient(base_url=s.base_url, timeout=60) for s in fleet]
            runs = [await new_run(c) for c in clients]
            sem = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with sem:
                    k = i % processes
                    await submit(clients[k], runs[k], f"s{i}", 1)

            await asyncio.gather(*(one(i) for i in range(steps)))
            conn = await asyncpg.connect(db_url.replace("+asyncpg", ""))
            try:
                deadline = time.monotonic() + 300
                while await conn.fetchval(
                    "SELECT count(*) FROM steps WHERE status IN ('queued', 'running')"
                ):
                    if time.monotonic() > deadline:
                        raise RuntimeError("steps did not end within 300 s")
                    await asyncio.sleep(0.2)
                rows = await conn.fetch("SELECT created_at, started_at, lease_owner FROM steps")
            finally:
                await conn.close()
            for c in clients:
                await c.aclose()
        finally:
            for s in fleet:
                await s.stop()
    waits = [(r["started_at"] - r["created_at"]).total_seconds() * 1000 for r in rows]
    span = (max(r["started_at"] for r in rows) - min(r["created_at"] for r in rows)).total_seconds()
    return {
        "processes": processes,
        "steps": len(rows),
        "claims_per_s": round(len(rows) / span, 1),
        "claim_latency_p50_ms": round(percentile(waits, 50) or 0, 1),
        "claim_latency_p99_ms": round(percentile(waits, 99) or 0, 1),
    }


async def arrivals(client: httpx.AsyncClient, step_id: str) -> dict[str, float]:
    seen: dict[str, float] = {}
    async with client.stream("GET", f"/v1/steps/{step_id}/stream") as r:
        buf = ""
        async for chunk in r.aiter_text():
            now = time.monotonic()
            buf += chunk
            while "\n\n" in buf:
                frame, buf = buf.split("\n\n", 1)
                if "event: token" in frame:
                    cursor = frame.split("\n", 1)[0].removeprefix("id: ")
                    seen.setdefault(cursor, now)
    return seen


async def cross_process(tokens: int, tmp: Path) -> dict[str, Any]:
    async with PgDatabase(ADMIN) as db_url:
        env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "50", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}
        a, b = await start_fleet(db_url, 2, tmp, **env)
        try:
            async with (
                httpx.AsyncClient(base_url=a.base_url, timeout=60) as ca,
                httpx.AsyncClient(base_url=b.base_url, timeout=60) as cb,
            ):
                await b.stop()  # so that the step runs on A: B starts again once it has
                run_id = await new_run(ca)
                step_id = await submit(ca, run_id, "paced", tokens)
                while (await ca.get(f"/v1/steps/{step_id}")).json()["status"] == "queued":
                    await asyncio.sleep(0.01)
                await b.start(timeout_s=120)
                on_a, on_b = await asyncio.gather(arrivals(ca, step_id), arrivals(cb, step_id))
        finally:
            await a.stop()
            await b.stop()
    # the first second's tokens were committed before both followers were in place: left out
    live = [(on_b[c] - on_a[c]) * 1000 for c in on_b if c in on_a and int(c) > 50]
    return {
        "tokens": len(live),
        "latency_p50_ms": round(percentile(live, 50) or 0, 2),
        "latency_p99_ms": round(percentile(live, 99) or 0, 2),
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=200)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results: dict[str, Any] = {"claims": [], "cross_process": None}
        for n in (1, 2, 3):
            results["claims"].append(await claims(n, args.steps, args.concurrency, Path(tmp)))
            print(json.dumps(results["claims"][-1]), flush=True)
        results["cross_process"] = await cross_process(args.tokens, Path(tmp))
    out = Path(__file__).parent / "results" / "scale_out.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
