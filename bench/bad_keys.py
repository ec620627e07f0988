"""Bad keys against a server with keys on: what they cost everyone else, and what their
rejection time tells.

One ``orchestratord serve --engine sim --auth`` process (SQLite) with one live key:

* **rejection**: ``--probes`` requests in turns with a wrong secret for the live key id and
  with an unknown key id; the time to the 401 of each (p50, p90). Equal within the noise:
  the answer's timing does not say which ids exist.
* **flood**: ``--flood`` connections send wrong secrets for the live key id as fast as they
  can for ``--seconds``, while one client asks ``GET /v1/runs`` with the valid key every
  20 ms; that client's latency (p50, p99, max) against the same without the flood. The
  valid key's client is a process of its own (in the flood's event loop it would time the
  flood client's work too). Run twice: with the per-address limit
  (``auth.max_failures_per_minute``, default; past it a request is held
  ``auth.limited_wait_s`` before its 429), with the limit but its 429s answered at once
  (``limited_wait_s`` 0), and with the limit off (``0``), which shows the verification's
  own cost.

    .venv/bin/python bench/bad_keys.py [--flood 200] [--seconds 10] [--probes 300]

Writes ``bench/results/bad_keys.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.relay import Server, free_port  # noqa: E402


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 3),
        "p90_ms": round(pct(values, 90), 3),
        "p99_ms": round(pct(values, 99), 3),
        "max_ms": round(max(values), 3),
    }


async def timed(client: httpx.AsyncClient, key: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    r = await client.get("/v1/runs", headers={"authorization": f"Bearer {key}"})
    return r.status_code, (time.perf_counter() - t0) * 1000


async def rejection(base: str, key_id: str, probes: int) -> dict[str, Any]:
    live: list[float] = []
    unknown: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for _ in range(probes):
            for into, kid in ((live, key_id), (unknown, secrets.token_hex(6))):
                code, ms = await timed(client, f"ok_{kid}_{secrets.token_urlsafe(32)}")
                assert code == 401, code
                into.append(ms)
    out: dict[str, Any] = {"live_id": summary(live), "unknown_id": summary(unknown)}
    out["p50_ratio_live_to_unknown"] = round(
        out["live_id"]["p50_ms"] / out["unknown_id"]["p50_ms"], 3
    )
    return out


async def probe(base: str, key: str, seconds: float) -> list[float]:
    times = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            code, ms = await timed(client, key)
            assert code == 200, code
            times.append(ms)
            await asyncio.sleep(0.02)
    return times


async def probe_process(base: str, key: str, seconds: float) -> list[float]:
    """``probe`` in a process of its own (``--probe``): its event loop times only itself."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--probe",
        base,
        key,
        str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    times: list[float] = json.loads(out)
    return times


async def flood(base: str, key_id: str, connections: int, seconds: float) -> int:
    sent = 0
    end = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=connections)

    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:

        async def one() -> None:
            nonlocal sent
            while time.perf_counter() < end:
                bad = f"ok_{key_id}_{secrets.token_urlsafe(32)}"
                with contextlib.suppress(httpx.HTTPError):
                    await client.get("/v1/runs", headers={"authorization": f"Bearer {bad}"})
                sent += 1

        await asyncio.gather(*(one() for _ in range(connections)))
    return sent


async def sitting(
    a: argparse.Namespace, failures_per_minute: int | None, wait_s: float | None = None
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bad-keys-"))
    db = f"sqlite:///{tmp / 'o.db'}"
    env = {**os.environ, "ORCHESTRATORD_DATABASE_URL": db, "ORCHESTRATORD_LOG_LEVEL": "warning"}
    if failures_per_minute is not None:
        env["ORCHESTRATORD_AUTH__MAX_FAILURES_PER_MINUTE"] = str(failures_per_minute)
    if wait_s is not None:
        env["ORCHESTRATORD_AUTH__LIMITED_WAIT_S"] = str(wait_s)
    made = subprocess.run(
        [sys.executable, "-m", "orchestratord", "keys", "create", "--scope", "read"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    key = made.stdout.strip().split()[-1]
    key_id = key.split("_")[1]
    port = free_port()
    argv = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim", "--auth"]
    server = Server("orchestratord", [*argv, "--port", str(port)], env, port, tmp / "s.log")
    await server.start()
    try:
        quiet = await probe_process(server.base_url, key, a.seconds / 2)
        probes, sent = await asyncio.gather(
            probe_process(server.base_url, key, a.seconds),
            flood(server.base_url, key_id, a.flood, a.seconds),
        )
        out: dict[str, Any] = {
            "valid_key_quiet": summary(quiet),
            "valid_key_under_flood": summary(probes),
            "bad_key_requests": sent,
        }
        if failures_per_minute == 0:  # the per-address limit would answer them all 429
            out["rejection"] = await rejection(server.base_url, key_id, a.probes)
        return out
    finally:
        await server.stop()


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "flood_connections": a.flood,
        "seconds": a.seconds,
        "limit_on": await sitting(a, None),
        "limit_on_answered_at_once": await sitting(a, None, 0.0),
        "limit_off": await sitting(a, 0),
    }


def main() -> None:
    if sys.argv[1:2] == ["--probe"]:  # the valid key's client, in a process of its own
        base, key, seconds = sys.argv[2], sys.argv[3], float(sys.argv[4])
        print(json.dumps(asyncio.run(probe(base, key, seconds))))
        return
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--flood", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--probes", type=int, default=300)
    a = ap.parse_args()
    out = asyncio.run(main_async(a))
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "bad_keys.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
