"""How long a cancel takes to reach the engine, for every engine protocol.

For each protocol (sim, llama on the real local model, openai, kakeya, salience, uma,
evergreen), the engine that counts the generations cut short (``test_harness/
cancel_counting.py``) behind one orchestratord (in this process, SQLite): ``--cancels``
steps, each cancelled over HTTP at a random point of its stream; the time from the cancel's
request to the engine counting it. Target: every cancel within 1 s.

    .venv/bin/python bench/cancel_latency.py [--cancels 50] [--protocols sim,openai,...]

Prints p50, p99 and max per protocol; writes ``bench/results/cancel_latency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestratord.api.app import create_app  # noqa: E402
from orchestratord.runtime import Orchestrator  # noqa: E402
from orchestratord.settings import Settings  # noqa: E402
from test_harness.cancel_counting import (  # noqa: E402
    PROTOCOLS,
    Engine,
    counting_engine,
    free_prices,
    pools_file,
    until_busy,
)
from worker_adapters.llama import default_model_path  # noqa: E402


def settings(name: str, eng: Engine, tmp: Path) -> Settings:
    common: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp / 'cancel.db'}",
        "price_tables_dir": free_prices(tmp),
        "dispatch": {"poll_s": 0.1},
        "log_level": "warning",
    }
    if eng.replica is None:
        return Settings(
            engine=name,
            sim={"tokens_per_s": 2000, "eos_probability": 0.0},
            llama_model_path=default_model_path(),
            **common,
        )
    return Settings(pools_file=pools_file(name, eng, tmp), **common)


async def measure(name: str, cancels: int) -> dict[str, float]:
    rng = random.Random(name)
    waits: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        async with counting_engine(name, tmp) as eng:
            orch = Orchestrator(settings(name, eng, tmp))
            await orch.start()
            try:
                pool = orch.pools.get("local")
                if eng.replica is None and pool is not None:
                    eng.local.append(pool.replicas[0].adapter)
                transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
                async with httpx.AsyncClient(transport=transport, base_url="http://b") as c:
                    flow = (await c.post("/v1/flows", json={"ast": {"bench": "cancel"}})).json()
                    run = (await c.post(f"/v1/flows/{flow['flow_id']}/runs", json={})).json()
                    for n in range(cancels):
                        waits.append(await one(c, eng, run["run_id"], n, rng))
            finally:
                await orch.stop()
    ordered = sorted(waits)
    return {
        "cancels": len(waits),
        "p50_ms": 1000 * statistics.median(waits),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "max_ms": 1000 * ordered[-1],
    }


async def one(c: httpx.AsyncClient, eng: Engine, run_id: str, n: int, rng: random.Random) -> float:
    """A step started, cancelled at a random point; seconds until the engine counted it."""
    await until_busy(eng, False)
    body = {
        "type": "llm_call",
        "client_token": f"c{n}",
        "input": {"prompt": f"say {n}", "params": {"max_tokens": 100_000, "temperature": 0}},
    }
    step = (await c.post(f"/v1/runs/{run_id}/steps", json=body)).json()["step_id"]
    await until_busy(eng, True)
    await asyncio.sleep(rng.uniform(0.0, 0.04))
    before = eng.cancelled()
    t0 = time.perf_counter()
    await c.post(f"/v1/steps/{step}/cancel")
    while eng.cancelled() == before:
        if time.perf_counter() - t0 > 30:
            raise RuntimeError(f"cancel {n} never reached the engine")
        await asyncio.sleep(0.001)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cancels", type=int, default=50)
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cancel_latency.json"))
    a = ap.parse_args()
    out: dict[str, Any] = {}
    for name in a.protocols.split(","):
        out[name] = asyncio.run(measure(name, a.cancels))
        row = out[name]
        print(
            f"{name:10} p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  "
            f"max {row['max_ms']:7.1f} ms  ({row['cancels']} cancels)",
            flush=True,
        )
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
