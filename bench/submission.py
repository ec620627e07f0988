"""A step's submission in-process: CPU per ``POST /v1/runs/{id}/steps`` with its execution.

One process runs an ``Orchestrator`` (sim engine, one token per step, as fast as it can) and
an ASGI client; the figure is that process's CPU time (``time.process_time``) per
submission, the client's share and the steps' execution included, after warm-up. No HTTP
server, no engine process: what a submission costs in the control plane's own code (the
rules, the transaction, the statements), measured without the noise of other processes.
``--pg`` runs on a fresh PostgreSQL database; ``--tree`` imports another checkout, for an
A/B (run both, interleaved: the machine drifts).

    .venv/bin/python bench/submission.py [--steps 1000] [--rounds 3] [--pg] [--tree DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


async def measure(url: str, steps: int) -> float:
    """ms of this process's CPU per submission."""
    import httpx

    from orchestratord.api.app import create_app
    from orchestratord.runtime import Orchestrator
    from orchestratord.settings import Settings

    settings = Settings(
        database_url=url,
        engine="sim",
        sim={"tokens_per_s": 0.0, "eos_probability": 0.0, "slots": 64},
        admission={"interactive_capacity": 1_000_000},
    )
    orch = Orchestrator(settings)
    await orch.start()
    app = create_app(orchestrator=orch)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            flow = (await c.post("/v1/flows", json={"ast": {"bench": "submission"}})).json()
            run = (await c.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 1})).json()

            def body() -> dict[str, Any]:
                return {
                    "type": "llm_call",
                    "client_token": uuid.uuid4().hex,
                    "input": {"prompt": "p", "params": {"max_tokens": 1}},
                }

            path = f"/v1/runs/{run['run_id']}/steps"
            for _ in range(50):  # warm-up: compiled statements, caches
                await c.post(path, json=body())
            await asyncio.sleep(0.5)
            cpu = time.process_time()
            for _ in range(steps):
                r = await c.post(path, json=body())
                if r.status_code != 202:
                    raise RuntimeError(f"submission answered {r.status_code}: {r.text[:300]}")
            spent = time.process_time() - cpu
            await orch.writer.wait_drained()
    finally:
        await orch.stop()
    return spent / steps * 1000


async def fresh_url(pg: bool, tmp: Path) -> tuple[str, Any]:
    if not pg:
        return f"sqlite:///{tmp / f'{uuid.uuid4().hex}.db'}", None
    from orchestratord.db.engine import Database
    from orchestratord.db.migrate import upgrade
    from tests.pg import create_database, drop_database

    url = await asyncio.to_thread(create_database)
    db = Database(url)
    await upgrade(db)
    await db.dispose()
    return url, lambda: drop_database(url)


async def main_async(a: argparse.Namespace) -> list[float]:
    tmp = Path(tempfile.mkdtemp())
    rounds: list[float] = []
    for _ in range(a.rounds):
        url, drop = await fresh_url(a.pg, tmp)
        try:
            rounds.append(await measure(url, a.steps))
        finally:
            if drop is not None:
                await asyncio.to_thread(drop)
        print(f"{rounds[-1]:.3f} ms of CPU per submission", flush=True)
    return rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pg", action="store_true")
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose code is measured")
    a = ap.parse_args()
    sys.path[:0] = [str(Path(a.tree).resolve()), str(ROOT)]
    rounds = asyncio.run(main_async(a))
    print(f"median {statistics.median(rounds):.3f} ms ({a.tree})")


if __name__ == "__main__":
    main()
