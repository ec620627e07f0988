"""What the budget reservation adds to step submission.

In one process and one run of this script, for SQLite and (with --pg) PostgreSQL:
  - POST /v1/runs/{id}/steps latency, p50 and p95, for a run without budgets and for a run
    with every budget kind set (the reservation then checks four limits in its UPDATE);
  - the reservation alone: the position UPDATE every submission makes, against the same
    UPDATE carrying the plan, the limit checks and the reserved counters.
Steps are admitted but the pool has no free slot, so dispatch work does not blur the figures.

    .venv/bin/python bench/reservation.py [--n 400] [--pg]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator_core import budgets
from orchestrator_core.budgets import Ledger, Limits
from orchestrator_core.pricing import Price
from orchestratord.api.app import create_app
from orchestratord.db.models import Run
from orchestratord.runs.ledger import reserve
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings

BUDGETS = {
    "max_tokens_in": 10**9,
    "max_tokens_out": 10**9,
    "max_wall_ms": 10**9,
    "max_cost_usd": 10**6,
}


POSITION_ONLY = (
    sa.update(Run)
    .where(Run.run_id == sa.bindparam("b_run_id"))
    .values(step_count=Run.step_count + 1)
    .returning(Run.step_count)
)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def measure(url: str, n: int) -> dict[str, Any]:
    settings = Settings(
        database_url=url,
        engine="sim",
        sim={"slots": 1, "tokens_per_s": 1.0},
        admission={"interactive_capacity": 10**6},
    )
    orch = Orchestrator(settings)
    await orch.start()
    orch.pools.pools["local"].replicas[0].slots = 0  # admit, never dispatch
    transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(transport=transport, base_url="http://b") as c:
        flow = (await c.post("/v1/flows", json={"ast": {"bench": "reservation"}})).json()
        runs = {
            label: (await c.post(f"/v1/flows/{flow['flow_id']}/runs", json=body)).json()
            for label, body in (("no budgets", {}), ("all budgets", {"budgets": BUDGETS}))
        }
        times: dict[str, list[float]] = {label: [] for label in runs}
        for i in range(n + 50):  # interleaved, so both see the same queue and table sizes
            for label, run in runs.items():
                t0 = time.perf_counter()
                r = await c.post(
                    f"/v1/runs/{run['run_id']}/steps",
                    json={
                        "type": "llm_call",
                        "client_token": f"{label}-{i}",
                        "input": {"prompt": "measure me", "params": {"max_tokens": 8}},
                    },
                )
                dt = time.perf_counter() - t0
                assert r.status_code == 202, r.text
                if i >= 50:
                    times[label].append(dt * 1000)
        for label, values in times.items():
            out[label] = {"p50_ms": pct(values, 0.5), "p95_ms": pct(values, 0.95)}
        run = (await c.post(f"/v1/flows/{flow['flow_id']}/runs", json={"budgets": BUDGETS})).json()
    limits = Limits.from_dict(BUDGETS)
    price = Price("tokens", input_per_million=1.0, output_per_million=2.0)
    # the reservation alone: the position UPDATE every submission needs, against the same
    # UPDATE carrying the plan, the four limit checks and the reserved counters
    samples: dict[str, list[float]] = {"position only": [], "position + reservation": []}
    for i in range(n + 50):
        for label in samples:
            t0 = time.perf_counter()
            async with orch.db.write() as session:
                if label == "position only":
                    await session.execute(POSITION_ONLY, {"b_run_id": run["run_id"]})
                else:
                    res = budgets.plan(
                        run=limits,
                        step=Limits(),
                        ledger=Ledger(),
                        tokens_in=3,
                        max_tokens=8,
                        price=price,
                        run_elapsed_ms=1.0,
                    )
                    await reserve(session, run_id=run["run_id"], limits=limits, reservation=res)
            if i >= 50:
                samples[label].append((time.perf_counter() - t0) * 1000)
    for label, values in samples.items():
        out[label] = {"p50_ms": pct(values, 0.5), "p95_ms": pct(values, 0.95)}
    await orch.stop()
    out["added_by_budgets_p50_ms"] = out["all budgets"]["p50_ms"] - out["no budgets"]["p50_ms"]
    out["reservation_p50_ms"] = (
        out["position + reservation"]["p50_ms"] - out["position only"]["p50_ms"]
    )
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--pg", action="store_true")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["SQLite"] = await measure(f"sqlite:///{tmp}/bench.db", args.n)
    if args.pg:
        from tests.pg import create_database, drop_database

        url = await asyncio.to_thread(create_database)
        try:
            results["PostgreSQL"] = await measure(url, args.n)
        finally:
            await asyncio.to_thread(drop_database, url)
    print(
        "| backend | submit p50, no budgets | submit p50, all budgets | added p50 "
        "| reservation alone p50 |"
    )
    print("|---|---|---|---|---|")
    for backend, r in results.items():
        print(
            f"| {backend} | {r['no budgets']['p50_ms']:.3f} ms | "
            f"{r['all budgets']['p50_ms']:.3f} ms | {r['added_by_budgets_p50_ms']:+.3f} ms | "
            f"{r['reservation_p50_ms']:+.3f} ms |"
        )
    out = Path(__file__).with_name("results") / "reservation.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"n": args.n, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
