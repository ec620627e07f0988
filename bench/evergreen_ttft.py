"""The Evergreen front door's added time to first token, against the same step over HTTP.

One ``orchestratord serve --engine sim --evergreen-port N`` process (SQLite; the sim engine
streams as fast as it can). Idle: one step at a time, ``--steps`` of each, taken in turns
(an HTTP step, then a session turn, ...) so that the machine's drift reaches both alike:

* **http**: ``POST /v1/runs/{id}/steps`` with ``Accept: text/event-stream`` (one request, as
  the interpreter does); TTFT = request sent -> first ``token`` frame read.
* **evergreen**: one session held open; each turn sends a ``GENERATE`` action and its prompt
  node in one message; TTFT = message sent -> first fragment of its response read; the turn
  ends at the response's last fragment.

    .venv/bin/python bench/evergreen_ttft.py [--steps 200] [--tokens 16]

Prints the p50 and p90 of each and the difference (target: evergreen p50 <= http p50 + 2 ms);
writes ``bench/results/evergreen_ttft.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.relay import Server  # noqa: E402
from contracts.protos import load  # noqa: E402

TARGET_ADDED_MS = 2.0
METHOD = "/evergreen.v2.EvergreenService/StartSession"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def http_step(client: httpx.AsyncClient, run_id: str, n: int, tokens: int) -> float:
    body = {
        "type": "llm_call",
        "client_token": f"h{n}",
        "input": {"prompt": f"http step {n}", "params": {"max_tokens": tokens}},
    }
    t0 = time.perf_counter()
    first = None
    async with client.stream(
        "POST",
        f"/v1/runs/{run_id}/steps",
        json=body,
        headers={"accept": "text/event-stream"},
    ) as r:
        async for line in r.aiter_lines():
            if first is None and line == "event: token":
                first = time.perf_counter()
            if line in ("event: end", "event: error"):
                break
    assert first is not None, "no token"
    return (first - t0) * 1000


class Session:
    """One front-door session, turn by turn."""

    def __init__(self, port: int, flow_id: str) -> None:
        import grpc  # type: ignore[import-untyped]

        self.pb = load()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.outgoing: asyncio.Queue[Any] = asyncio.Queue()
        call = self.channel.stream_stream(
            METHOD,
            request_serializer=self.pb.evergreen_service.SessionMessage.SerializeToString,
            response_deserializer=self.pb.evergreen_service.SessionMessage.FromString,
        )
        metadata = (("x-flow-id", flow_id), ("x-run", json.dumps({"seed": 1})))
        self.call = call(self._requests(), metadata=metadata)
        self.replies = self.call.__aiter__()

    async def _requests(self) -> Any:
        while (message := await self.outgoing.get()) is not None:
            yield message

    async def turn(self, n: int, tokens: int) -> float:
        ev, pb = self.pb.evergreen, self.pb
        config = pb.evergreen_config.GenerateConfig(max_tokens=tokens)
        action = ev.Action(name="GENERATE")
        action.inputs.add(name="prompt", id=f"p{n}")
        action.outputs.add(name="response", id=f"r{n}")
        action.configs.add().Pack(config)
        chunk = ev.Chunk(data=f"evergreen step {n}".encode())
        chunk.metadata.mimetype = "text/plain"
        message = pb.evergreen_service.SessionMessage(
            actions=[action], node_fragments=[ev.NodeFragment(id=f"p{n}", chunk_fragment=chunk)]
        )
        t0 = time.perf_counter()
        self.outgoing.put_nowait(message)
        first = None
        while True:
            reply = await self.replies.__anext__()
            for fragment in reply.node_fragments:
                if fragment.id != f"r{n}":
                    continue
                if first is None:
                    first = time.perf_counter()
                if not fragment.continued:
                    return (first - t0) * 1000

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        async for _ in self.replies:
            pass
        await self.channel.close()


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    port, evergreen = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="evergreen-ttft-"))
    env = {
        **os.environ,
        "ORCHESTRATORD_SIM__TOKENS_PER_S": "0",
        "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
        "ORCHESTRATORD_LOG_LEVEL": "warning",
    }
    argv = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim"]
    argv += ["--port", str(port), "--evergreen-port", str(evergreen)]
    argv += ["--database-url", f"sqlite:///{tmp / 'o.db'}"]
    server = Server("orchestratord", argv, env, port, tmp / "server.log")
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            flow_id = (await client.post("/v1/flows", json={"ast": {"ttft": 1}})).json()["flow_id"]
            run = await client.post(f"/v1/flows/{flow_id}/runs", json={"seed": 1})
            run_id = run.json()["run_id"]
            session = Session(evergreen, flow_id)
            for n in range(a.warmup):  # connections, caches, the session's run
                await http_step(client, run_id, -n - 1, a.tokens)
                await session.turn(-n - 1, a.tokens)
            http, door = [], []
            for n in range(a.steps):
                http.append(await http_step(client, run_id, n, a.tokens))
                door.append(await session.turn(n, a.tokens))
            await session.close()
    finally:
        await server.stop()
    out = {
        "steps": a.steps,
        "tokens": a.tokens,
        "http_p50_ms": round(statistics.median(http), 3),
        "http_p90_ms": round(pct(http, 90), 3),
        "evergreen_p50_ms": round(statistics.median(door), 3),
        "evergreen_p90_ms": round(pct(door, 90), 3),
    }
    out["added_p50_ms"] = round(out["evergreen_p50_ms"] - out["http_p50_ms"], 3)
    out["target_added_p50_ms"] = TARGET_ADDED_MS
    out["met"] = out["added_p50_ms"] <= TARGET_ADDED_MS
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    out = asyncio.run(main_async(a))
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "evergreen_ttft.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
