"""Several orchestratord processes on one PostgreSQL database: claims and cross-process streams.

**Claims**, with 1, 2 and 3 processes (``orchestratord serve --engine sim``, each declaring
the 8-slot sim replica at full speed, one fresh database per round): the client submits
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
        [--processes 1 2 3] [--slots 8] [--trees A B [--slots 8 24] --rounds 3] [--no-streams]
        [--out FILE]

``--slots N``: the sim replica's slots in each process (``ORCHESTRATORD_SIM__SLOTS``). Every
process declares the same pool ``local`` and replica ``r0``: where a replica's slots are held
across processes (PostgreSQL, ``orchestratord/pools/slots.py``) the processes share N slots,
before that each had N of its own.

``--trees A B``: the servers run the code of each checkout in turn (``PYTHONPATH`` and cwd
the checkout; a checkout may be named twice, with ``--slots`` one value per tree), round by
round for ``--rounds`` rounds, each process count within a round taking turns between the
trees; each row then also says its tree, slots, round, the submissions' response times
(p50, p99: a step that starts in its submission has its ``created_at`` and ``started_at``
stamped before its statement runs, what that statement waits for is in its submission's
time), the schema version its database reached (which tree migrated it) and the lines the
servers logged (warnings and above), and ``median`` the median per tree, slots and process
count. Without ``--trees``: this checkout, one round, the output as above.

Writes ``bench/results/scale_out.json`` (or ``--out``) and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.relay import ROOT, PgDatabase, Server, free_port, percentile, server_env

ADMIN = os.environ.get("ORCHESTRATORD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
FIGURES = ("claims_per_s", "claim_latency_p50_ms", "claim_latency_p99_ms")
# a claims row's fields with --trees only
EXTRA = ("submit_latency_p50_ms", "submit_latency_p99_ms", "schema", "log_lines", "log_head")


async def start_fleet(
    db_url: str, n: int, tmp: Path, env: dict[str, str], tree: Path = ROOT
) -> list[Server]:
    servers = []
    for i in range(n):  # one after the other: the first migrates the fresh database
        port = free_port()
        argv = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim"]
        argv += ["--port", str(port), "--database-url", db_url]
        extra = {"ORCHESTRATORD_INSTANCE": f"p{i}", "ORCHESTRATORD_LOG_LEVEL": "warning", **env}
        server = Server(f"p{i}", argv, server_env(extra), port, tmp / f"p{i}.log")
        if tree != ROOT:  # that checkout's code, not this one's
            server.env["PYTHONPATH"] = str(tree)
            server.cwd = tree
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


async def claims(
    processes: int,
    steps: int,
    concurrency: int,
    tmp: Path,
    tree: Path = ROOT,
    slots: int | None = None,
) -> dict[str, Any]:
    import asyncpg

    async with PgDatabase(ADMIN) as db_url:
        env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "0", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}
        if slots is not None:
            env["ORCHESTRATORD_SIM__SLOTS"] = str(slots)
        fleet = await start_fleet(db_url, processes, tmp, env, tree)
        try:
            clients = [httpx.AsyncClient(base_url=s.base_url, timeout=60) for s in fleet]
            runs = [await new_run(c) for c in clients]
            sem = asyncio.Semaphore(concurrency)
            posts: list[float] = []  # each submission's response time, ms

            async def one(i: int) -> None:
                async with sem:
                    k = i % processes
                    t0 = time.monotonic()
                    await submit(clients[k], runs[k], f"s{i}", 1)
                    posts.append((time.monotonic() - t0) * 1000)

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
                schema = await conn.fetchval("SELECT version_num FROM alembic_version")
            finally:
                await conn.close()
            for c in clients:
                await c.aclose()
        finally:
            for s in fleet:
                await s.stop()
            # what the servers logged at warning and above (errors, if any)
            logged = [line for s in fleet for line in s.log_tail(10_000).splitlines() if line]
    waits = [(r["started_at"] - r["created_at"]).total_seconds() * 1000 for r in rows]
    span = (max(r["started_at"] for r in rows) - min(r["created_at"] for r in rows)).total_seconds()
    return {
        "processes": processes,
        "steps": len(rows),
        "claims_per_s": round(len(rows) / span, 1),
        "claim_latency_p50_ms": round(percentile(waits, 50) or 0, 1),
        "claim_latency_p99_ms": round(percentile(waits, 99) or 0, 1),
        "submit_latency_p50_ms": round(percentile(posts, 50) or 0, 1),
        "submit_latency_p99_ms": round(percentile(posts, 99) or 0, 1),
        "schema": schema,
        "log_lines": len(logged),
        "log_head": logged[:5],
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
        a, b = await start_fleet(db_url, 2, tmp, env)
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


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tree, slots and process count: each figure's median over the rounds, its range."""
    out = []
    for side in dict.fromkeys((row["tree"], row["slots"], row["processes"]) for row in rows):
        mine = [row for row in rows if (row["tree"], row["slots"], row["processes"]) == side]
        figures: dict[str, Any] = dict(zip(("tree", "slots", "processes"), side, strict=True))
        figures["rounds"] = len(mine)
        for key in (*FIGURES, "submit_latency_p50_ms", "submit_latency_p99_ms"):
            values = [row[key] for row in mine]
            figures[key] = statistics.median(values)
            figures[f"{key}_range"] = [min(values), max(values)]
        out.append(figures)
    return out


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--slots", type=int, nargs="+", help="sim slots per process, or per tree")
    p.add_argument("--trees", type=Path, nargs="+", help="checkouts whose code the servers run")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-streams", action="store_true", help="claims only")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results/scale_out.json")
    args = p.parse_args()
    trees = [t.resolve() for t in args.trees or [ROOT]]
    slots = args.slots or [None]
    if len(slots) not in (1, len(trees)):
        p.error("--slots: one value, or one per tree")
    sides = list(zip(trees, slots * len(trees) if len(slots) == 1 else slots, strict=True))
    with tempfile.TemporaryDirectory() as tmp:
        results: dict[str, Any] = {"claims": [], "cross_process": None}
        if args.trees:
            results["args"] = vars(args)
        for r in range(args.rounds):
            for n in args.processes:
                for tree, k in sides:
                    row = await claims(n, args.steps, args.concurrency, Path(tmp), tree, k)
                    if args.trees:
                        row = {"tree": str(tree), "slots": k, "round": r, **row}
                    else:  # the output's shape of before these options
                        for key in EXTRA:
                            row.pop(key)
                    results["claims"].append(row)
                    print(json.dumps(row), flush=True)
        if args.trees:
            results["median"] = medians(results["claims"])
        if not args.no_streams:
            results["cross_process"] = await cross_process(args.tokens, Path(tmp))
    out = args.out
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    asyncio.run(main())
