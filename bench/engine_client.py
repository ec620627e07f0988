"""The engine HTTP client against httpx: CPU per 1-token generation of the reading process.

The fake OpenAI-compatible engine of ``test_harness`` runs in its own process; this process
sends ``--requests`` streamed 1-token completions one after another on one kept-alive
connection and reads each body to its end, with ``worker_adapters/http1.py`` and with an
``httpx.AsyncClient`` (what it replaced; ``aiter_raw``, no decoding), in alternating rounds,
and counts its own CPU time (``time.process_time``) per request. ``--tree`` imports
``worker_adapters`` from another checkout, for an A/B of the client itself.

    .venv/bin/python bench/engine_client.py [--requests 2000] [--rounds 5] [--tree DIR]

Prints every round and the medians; writes ``bench/results/engine_client.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BODY = (
    b'{"model":"fake-model","prompt":"p","max_tokens":1,"seed":1,"stream":true,'
    b'"stream_options":{"include_usage":true}}'
)


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from bench import latency
    from worker_adapters.http1 import Http1Client

    tmp = Path(tempfile.mkdtemp())
    engine, upstream = await latency.start_engine(tmp)
    ours = Http1Client(f"{upstream}/v1")
    theirs = httpx.AsyncClient(base_url=upstream, trust_env=False)
    headers = {"content-type": "application/json"}

    async def via_http1() -> int:
        async with ours.stream("POST", "/v1/completions", body=BODY) as response:
            return len(await response.read())

    async def via_httpx() -> int:
        async with theirs.stream(
            "POST", "/v1/completions", content=BODY, headers=headers
        ) as response:
            return len(b"".join([chunk async for chunk in response.aiter_raw()]))

    clients: dict[str, Callable[[], Awaitable[int]]] = {"http1": via_http1, "httpx": via_httpx}
    per_request_ms: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for read in clients.values():  # connections open, code warm
            assert all([await read() for _ in range(50)])
        for _ in range(a.rounds):
            for name, read in clients.items():
                cpu = time.process_time()
                for _ in range(a.requests):
                    await read()
                per_request_ms[name].append((time.process_time() - cpu) * 1000 / a.requests)
            print("  ".join(f"{n} {v[-1]:.3f} ms" for n, v in per_request_ms.items()), flush=True)
    finally:
        await ours.aclose()
        await theirs.aclose()
        await engine.stop()
    return {
        "args": {k: str(v) for k, v in vars(a).items()},
        "cpu_ms_per_request": per_request_ms,
        "median": {name: statistics.median(v) for name, v in per_request_ms.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose client is measured")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_client.json"))
    a = ap.parse_args()
    sys.path[:0] = [str(Path(a.tree).resolve()), str(ROOT)]
    out = asyncio.run(measure(a))
    print("median " + "  ".join(f"{n} {v:.3f} ms" for n, v in out["median"].items()))
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
