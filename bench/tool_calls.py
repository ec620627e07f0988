"""tool_call throughput: builtin ``echo`` steps per second, end to end.

The server runs in its own process (``orchestratord serve --engine sim``). Each of
``--clients`` concurrent clients loops: submit a ``tool_call`` step (builtin ``echo``), then
follow its stream until ``end``; the next step starts when the client has seen ``end``.
Steps per second = steps ended / wall time of the round (first submit to last ``end``).
Also reported: the median and p95 latency of one step as a client sees it (submit -> end).
Measured on SQLite (a fresh file) and, with ``--pg``, on a fresh PostgreSQL database.

    .venv/bin/python bench/tool_calls.py [--clients 8] [--steps 400] [--repeat 3] [--pg]

Writes ``bench/results/tool_calls.json`` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.relay import PgDatabase, Server, free_port, server_env
from bench.replay import follow

ECHO = {
    "name": "echo",
    "description": "says its args back",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
    "executor": {"kind": "builtin", "name": "echo"},
}


async def one_client(
    base_url: str, run_id: str, who: int, steps: int, latencies: list[float]
) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        for i in range(steps):
            start = time.perf_counter()
            r = await client.post(
                f"/v1/runs/{run_id}/steps",
                json={
                    "type": "tool_call",
                    "client_token": f"c{who}-{i}",
                    "input": {"tool": "echo", "args": {"n": i}},
                },
            )
            r.raise_for_status()
            last = await follow(client, r.json()["step_id"])
            assert last == "end", f"step ended with {last}"
            latencies.append(time.perf_counter() - start)


async def measure(
    database_url: str, clients: int, steps: int, repeat: int, tmp: str
) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim"]
    argv += ["--port", str(port), "--database-url", database_url]
    server = Server("orchestratord", argv, server_env({}), port, Path(tmp) / "server.log")
    await server.start(timeout_s=120)
    rounds = []
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            flow_id = (
                await client.post("/v1/flows", json={"ast": {"bench": "tools"}, "tools": [ECHO]})
            ).json()["flow_id"]
            per_client = max(1, steps // clients)
            for r in range(repeat + 1):  # round 0 warms up
                run_id = (await client.post(f"/v1/flows/{flow_id}/runs", json={})).json()["run_id"]
                latencies: list[float] = []
                start = time.perf_counter()
                await asyncio.gather(
                    *(
                        one_client(server.base_url, run_id, c, per_client, latencies)
                        for c in range(clients)
                    )
                )
                wall = time.perf_counter() - start
                if r == 0:
                    continue
                lat = sorted(latencies)
                rounds.append(
                    {
                        "steps": len(lat),
                        "wall_s": round(wall, 3),
                        "steps_per_s": round(len(lat) / wall, 1),
                        "latency_p50_ms": round(statistics.median(lat) * 1000, 2),
                        "latency_p95_ms": round(lat[int(0.95 * (len(lat) - 1))] * 1000, 2),
                    }
                )
                print(f"  round {r}: {rounds[-1]}", flush=True)
    finally:
        await server.stop()
    return {
        "rounds": rounds,
        "median_steps_per_s": statistics.median(x["steps_per_s"] for x in rounds),
        "median_latency_p50_ms": statistics.median(x["latency_p50_ms"] for x in rounds),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"clients": args.clients, "steps": args.steps, "repeat": args.repeat}
    with tempfile.TemporaryDirectory() as tmp:
        print("sqlite", flush=True)
        out["sqlite"] = await measure(
            f"sqlite:///{tmp}/bench.db", args.clients, args.steps, args.repeat, tmp
        )
        if args.pg:
            print("postgresql", flush=True)
            async with PgDatabase(args.pg_url) as url:
                out["postgresql"] = await measure(url, args.clients, args.steps, args.repeat, tmp)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg", action="store_true")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "tool_calls.json"))
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
