"""The OpenAI adapter alone: events per CPU-second of the process that reads the streams.

The fake OpenAI-compatible engine of ``test_harness`` runs in its own process (streaming as
fast as it can); this process runs ``--streams`` concurrent ``OpenAIAdapter.stream`` calls
of ``--tokens`` tokens each and counts its own CPU time (``time.process_time``). No server,
no database: what a relayed token costs in the engine client before orchestratord touches
it. ``--tree`` imports ``worker_adapters`` from another checkout, for an A/B.

    .venv/bin/python bench/openai_adapter.py [--streams 20] [--tokens 1000] [--rounds 5]
        [--tree /path/to/checkout]

Prints every round and the median; writes ``bench/results/openai_adapter.json``.
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

ROOT = Path(__file__).resolve().parents[1]


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    from bench import latency
    from worker_adapters.base import GenerationRequest
    from worker_adapters.openai import OpenAIAdapter

    tmp = Path(tempfile.mkdtemp())
    engine, upstream = await latency.start_engine(tmp)
    adapter = OpenAIAdapter(base_url=f"{upstream}/v1", model="fake-model")

    async def one(i: int, tokens: int) -> int:
        request = GenerationRequest(
            request_id=f"r{i}", prompt="p", messages=None, seed=i, max_tokens=tokens
        )
        return sum([1 async for _ in adapter.stream(request)])

    rounds: list[float] = []
    try:
        await asyncio.gather(*(one(i, 50) for i in range(a.streams)))  # connections, warm
        for _ in range(a.rounds):
            cpu = time.process_time()
            events = sum(await asyncio.gather(*(one(i, a.tokens) for i in range(a.streams))))
            rounds.append(events / (time.process_time() - cpu))
            print(f"{rounds[-1]:,.0f} events per CPU-s", flush=True)
    finally:
        await adapter.aclose()
        await engine.stop()
    return {
        "args": {k: str(v) for k, v in vars(a).items()},
        "events_per_cpu_s": rounds,
        "median": statistics.median(rounds),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose adapter is measured")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "openai_adapter.json"))
    a = ap.parse_args()
    sys.path[:0] = [str(Path(a.tree).resolve()), str(ROOT)]
    out = asyncio.run(measure(a))
    print(f"median {out['median']:,.0f} events per CPU-s")
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
