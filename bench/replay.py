"""Replay against record on the real local model (Gemma 3 270M through llama.cpp).

One run of this script, the server in its own process: a record run of ``--steps`` steps
(sampled, ``--max-tokens`` each) is timed as an interpreter sees it (submit, follow the
stream to its end, next step); then the same steps are submitted to a ``replay`` run
(served from the record, no engine) and to a ``strict_replay`` run (re-executed and
compared), timed the same way. Reported: wall time of each, the replay speed-up
(record / replay; target >= 20x), and that the strict replay was identical.

    .venv/bin/python bench/replay.py [--steps 4] [--max-tokens 64] [--repeat 3]
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

from bench.relay import Server, free_port, server_env

PROMPTS = [
    "Write one sentence about rivers.",
    "List three colors.",
    "What is a replay log?",
    "Describe a stone in a few words.",
    "Name a prime number and say why.",
    "Give a short greeting.",
]


async def follow(client: httpx.AsyncClient, step_id: str) -> str:
    """Read the step's stream to its terminal event; return that event's type."""
    last = ""
    async with client.stream("GET", f"/v1/steps/{step_id}/stream") as r:
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                last = line[7:]
    return last


async def drive(client: httpx.AsyncClient, run_id: str, steps: int, max_tokens: int) -> float:
    start = time.perf_counter()
    for i in range(steps):
        r = await client.post(
            f"/v1/runs/{run_id}/steps",
            json={
                "type": "llm_call",
                "client_token": f"s{i}",
                "input": {
                    "prompt": PROMPTS[i % len(PROMPTS)],
                    "params": {"max_tokens": max_tokens, "temperature": 0.8, "top_k": 40},
                },
            },
        )
        r.raise_for_status()
        last = await follow(client, r.json()["step_id"])
        assert last == "end", f"step {i} ended with {last}"
    return time.perf_counter() - start


async def measure(steps: int, max_tokens: int, repeat: int) -> dict[str, Any]:
    """The server is its own process, as deployed (the client shares no event loop with it)."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        argv = [sys.executable, "-m", "orchestratord", "serve", "--engine", "llama"]
        argv += ["--port", str(port), "--database-url", f"sqlite:///{tmp}/bench.db"]
        server = Server("orchestratord", argv, server_env({}), port, Path(tmp) / "server.log")
        await server.start(timeout_s=120)
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as client:
                flow = (await client.post("/v1/flows", json={"ast": {"bench": "replay"}})).json()
                flow_id = flow["flow_id"]
                record_s, replay_s, strict_s, tokens = [], [], [], []
                for _ in range(repeat):
                    run = await client.post(f"/v1/flows/{flow_id}/runs", json={"seed": 1234})
                    source = run.json()["run_id"]
                    record_s.append(await drive(client, source, steps, max_tokens))
                    got = (await client.get(f"/v1/runs/{source}")).json()
                    tokens.append(got["usage"]["tokens_out"])
                    for mode, out in (("replay", replay_s), ("strict_replay", strict_s)):
                        r = await client.post(
                            f"/v1/flows/{flow_id}/runs",
                            json={"mode": mode, "source_run_id": source},
                        )
                        r.raise_for_status()
                        replay_id = r.json()["run_id"]
                        out.append(await drive(client, replay_id, steps, max_tokens))
                        report = (await client.get(f"/v1/runs/{replay_id}/replay-report")).json()
                        assert not report["diverged"] and report["complete"], report
        finally:
            await server.stop()
    rec, rep, strict = (statistics.median(x) for x in (record_s, replay_s, strict_s))
    return {
        "steps": steps,
        "max_tokens": max_tokens,
        "repeat": repeat,
        "tokens_out_per_run": tokens,
        "record_s": record_s,
        "replay_s": replay_s,
        "strict_replay_s": strict_s,
        "median_record_s": round(rec, 4),
        "median_replay_s": round(rep, 4),
        "median_strict_replay_s": round(strict, 4),
        "replay_speedup": round(rec / rep, 1),
        "strict_over_record": round(strict / rec, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "replay.json"))
    args = parser.parse_args()
    result = asyncio.run(measure(args.steps, args.max_tokens, args.repeat))
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
