"""Relay cost from an OpenAI-compatible engine to SSE clients: tokens/s per core.

One run, for ``--streams`` concurrent streams of ``--tokens`` tokens, against the fake
OpenAI server of ``test_harness`` (its own process, streaming as fast as it can):
  * bare relay (bench/openai_bare_relay.py): upstream chunk -> SSE frame, nothing stored;
  * orchestratord with an ``openai`` pool on that server, persistence on (SQLite; with
    ``--pg`` PostgreSQL too): the client submits steps and follows their streams.
Tokens per second per core = tokens delivered / CPU seconds the relay process used
(user + system, from /proc); the upstream's and the client's CPU are not counted.

    .venv/bin/python bench/openai_relay.py [--streams 50] [--tokens 2000] [--pg]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.procs import free_port  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start(
    args: list[str], ready: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            if httpx.get(ready, timeout=1).status_code < 500:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{args[:3]} did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def drive(base: str, streams: int, tokens: int, orchestrated: bool) -> int:
    limits = httpx.Limits(max_connections=streams * 2)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as c:
        run_id = ""
        if orchestrated:
            flow = (await c.post("/v1/flows", json={"ast": {"bench": "openai"}})).json()
            run_id = (await c.post(f"/v1/flows/{flow['flow_id']}/runs", json={})).json()["run_id"]

        async def one(i: int) -> int:
            if orchestrated:
                r = await c.post(
                    f"/v1/runs/{run_id}/steps",
                    json={
                        "type": "llm_call",
                        "client_token": f"b{i}-{time.monotonic_ns()}",
                        "input": {"prompt": "x", "params": {"max_tokens": tokens}},
                    },
                )
                path = f"/v1/steps/{r.json()['step_id']}/stream"
            else:
                path = f"/relay?tokens={tokens}"
            n = 0
            async with c.stream("GET", path) as s:
                async for line in s.aiter_lines():
                    if line == "event: token":
                        n += 1
            return n

        return sum(await asyncio.gather(*(one(i) for i in range(streams))))


def measure(
    proc: subprocess.Popen[bytes], base: str, a: argparse.Namespace, orchestrated: bool
) -> dict[str, Any]:
    asyncio.run(drive(base, 4, 200, orchestrated))  # warm-up
    rounds = []
    for _ in range(a.repeat):
        cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
        delivered = asyncio.run(drive(base, a.streams, a.tokens, orchestrated))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(proc.pid) - cpu0
        assert delivered == a.streams * a.tokens, delivered
        rounds.append(
            {
                "tokens": delivered,
                "wall_s": wall,
                "cpu_s": cpu,
                "tok_per_s": delivered / wall,
                "tok_per_cpu_s": delivered / cpu,
            }
        )
    best = sorted(rounds, key=lambda r: r["tok_per_cpu_s"])[len(rounds) // 2]
    return {"median_round": best, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pg", action="store_true")
    a = ap.parse_args()
    py = sys.executable
    results: dict[str, Any] = {}
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    fake = start(
        [
            py,
            "-c",
            "import uvicorn; from test_harness.fake_openai import "
            "create_fake_openai as f; uvicorn.run(f(), host='127.0.0.1', "
            f"port={up_port}, log_level='warning')",
        ],
        f"{upstream}/health",
    )
    tmp = Path(tempfile.mkdtemp())
    try:
        port = free_port()
        bare = start(
            [py, "bench/openai_bare_relay.py", "--port", str(port), "--upstream", f"{upstream}/v1"],
            f"http://127.0.0.1:{port}/relay?tokens=1",
        )
        try:
            results["bare relay"] = measure(bare, f"http://127.0.0.1:{port}", a, False)
        finally:
            stop(bare)
        (tmp / "prices").mkdir()
        (tmp / "prices" / "2026-01-01.yaml").write_text(
            'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
            "  - {engine: openai, model: fake-model, free: true}\n"
        )
        (tmp / "pools.yaml").write_text(
            json.dumps(
                {
                    "pools": [
                        {
                            "pool_id": "gpu",
                            "engine": "openai",
                            "replicas": [
                                {
                                    "replica_id": "r1",
                                    "url": f"{upstream}/v1",
                                    "model": "fake-model",
                                    "slots": a.streams,
                                }
                            ],
                        }
                    ]
                }
            )
        )
        dbs = {"orchestratord (SQLite)": f"sqlite:///{tmp / 'o.db'}"}
        pg_url = None
        if a.pg:
            from tests.pg import create_database

            pg_url = create_database()
            dbs["orchestratord (PostgreSQL)"] = pg_url
        env = {
            "ORCHESTRATORD_PRICE_TABLES_DIR": str(tmp / "prices"),
            "ORCHESTRATORD_LOG_LEVEL": "warning",
            "ORCHESTRATORD_ADMISSION__INTERACTIVE_CAPACITY": "100000",
        }
        for label, url in dbs.items():
            port = free_port()
            srv = start(
                [
                    py,
                    "-m",
                    "orchestratord",
                    "serve",
                    "--port",
                    str(port),
                    "--pools",
                    str(tmp / "pools.yaml"),
                    "--database-url",
                    url,
                ],
                f"http://127.0.0.1:{port}/healthz",
                env,
            )
            try:
                results[label] = measure(srv, f"http://127.0.0.1:{port}", a, True)
            finally:
                stop(srv)
        if pg_url:
            from tests.pg import drop_database

            drop_database(pg_url)
    finally:
        stop(fake)
    base = results["bare relay"]["median_round"]["tok_per_cpu_s"]
    print(f"{a.streams} streams x {a.tokens} tokens, median of {a.repeat} rounds\n")
    print("| relay | delivered tokens/s | tokens/s per core (relay CPU) | vs bare relay |")
    print("|---|---|---|---|")
    for label, r in results.items():
        m = r["median_round"]
        print(
            f"| {label} | {m['tok_per_s']:,.0f} | {m['tok_per_cpu_s']:,.0f} | "
            f"{m['tok_per_cpu_s'] / base:.2f} |"
        )
    out = ROOT / "bench" / "results" / "openai_relay.json"
    out.write_text(
        json.dumps({"streams": a.streams, "tokens": a.tokens, "results": results}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
