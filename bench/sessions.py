"""Wire bytes per turn: a run's session on the engine against resending the conversation.

A 20-turn conversation (20 tokens generated a turn) is driven through orchestratord against
an engine behind a counting TCP proxy that measures the bytes orchestratord sends to the
engine, with its turns built two ways:

* **appended**: each prompt is the conversation so far (prompts and replies) plus a new
  user line;
* **re-rendered**: each prompt is the previous prompt + the model's reply + a new question
  as a transcript turn (``\nUser: ...\nAssistant:``), as an interpreter that re-renders a
  chat sends it. Tokenized whole, such a text is not the engine's ids (the reply's first word
  joins the label before it, its last word the newline after it).

and each against two engines:

* **session**: a ``kakeya`` pool (the reference runtime, gRPC, sim tokens): the run keeps one
  engine session and each turn appends only its new tokens; the runtime counts the sessions
  it was asked to create;
* **resend**: an ``openai`` pool (the fake OpenAI-compatible server): every turn sends the
  whole conversation as its prompt, as a stateless engine needs.

The orchestratord instances run in this process (SQLite); the engines too. Time per turn is
step ``POST`` -> ``succeeded`` as the client sees it.

    .venv/bin/python bench/sessions.py [--turns 20]

Writes ``bench/results/sessions.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestratord.api.app import create_app  # noqa: E402
from orchestratord.pools.config import PoolSpec, ReplicaSpec  # noqa: E402
from orchestratord.pools.registry import build_registry  # noqa: E402
from orchestratord.runtime import Orchestrator  # noqa: E402
from test_harness.fake_openai import create_fake_openai  # noqa: E402
from test_harness.kakeya_runtime import serve_kakeya  # noqa: E402
from test_harness.servers import serve_app  # noqa: E402
from tests.conftest import make_settings  # noqa: E402

USER_LINES = ["alpha beta gamma delta echo fox golf hotel ", "delta echo alpha fox beta gamma "]
QUESTIONS = ["what is the plan for this step?", "and which tool is called from the flow?"]
MODES = ("appended", "re-rendered")


class CountingProxy:
    """TCP proxy to ``target``; counts the bytes clients send upstream."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sent = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(self.host, self.port)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, count: bool) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await r.read(65536):
                    if count:
                        self.sent += len(data)
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_w, True), pipe(up_r, writer, False))


@contextlib.asynccontextmanager
async def service(engine: str, url: str, tmp: Path) -> AsyncIterator[httpx.AsyncClient]:
    prices = tmp / f"prices-{engine}"
    prices.mkdir()
    model = "fake-model" if engine == "openai" else "sim-1"
    (prices / "2026-01-01.yaml").write_text(
        'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        f"  - {{engine: {engine}, model: {model}, free: true}}\n"
    )
    settings = make_settings(f"sqlite:///{tmp / engine}.db", price_tables_dir=prices)
    options = {"tokenizer": "sim"} if engine == "kakeya" else {}
    replica = ReplicaSpec(replica_id="r1", url=url, model=model, options=options)
    spec = PoolSpec(pool_id="p", engine=engine, replicas=[replica])  # type: ignore[arg-type]
    orch = Orchestrator(settings, pools=build_registry([spec], settings))
    await orch.start()
    try:
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url="http://o") as client:
            yield client
    finally:
        await orch.stop()


def first_prompt(mode: str) -> str:
    return USER_LINES[0] if mode == "appended" else f"User: {QUESTIONS[0]}\nAssistant:"


def next_prompt(mode: str, prompt: str, reply: str, turn: int) -> str:
    """The prompt of turn ``turn`` (from 1) after ``prompt`` was answered with ``reply``."""
    if mode == "appended":
        return prompt + reply + USER_LINES[turn % 2]
    return prompt + reply + f"\nUser: {QUESTIONS[turn % 2]} ({turn})\nAssistant:"


async def conversation(
    client: httpx.AsyncClient, proxy: CountingProxy, turns: int, mode: str
) -> list[Any]:
    flow = (await client.post("/v1/flows", json={"ast": {"bench": "sessions"}})).json()
    run_id = (await client.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 1})).json()[
        "run_id"
    ]
    text, rows = first_prompt(mode), []
    for turn in range(turns):
        before, t0 = proxy.sent, time.perf_counter()
        r = await client.post(
            f"/v1/runs/{run_id}/steps",
            json={
                "type": "llm_call",
                "client_token": f"turn-{turn}",
                "input": {"prompt": text, "params": {"max_tokens": 20}},
            },
        )
        step_id = r.json()["step_id"]
        while (step := (await client.get(f"/v1/steps/{step_id}")).json())["status"] in (
            "queued",
            "running",
        ):
            await asyncio.sleep(0.002)
        if step["status"] != "succeeded":
            raise RuntimeError(f"turn {turn}: {step['status']} {step.get('error')}")
        rows.append(
            {"bytes": proxy.sent - before, "s": time.perf_counter() - t0, "prompt_chars": len(text)}
        )
        text = next_prompt(mode, text, step["output"]["text"], turn + 1)
    return rows


async def main_async(turns: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp())
    out: dict[str, Any] = {"turns": turns, "engine_sessions": {}}
    for mode in MODES:
        (tmp / mode).mkdir()
        async with serve_kakeya() as rt:
            host, port = rt.address.rsplit(":", 1)
            proxy = CountingProxy(host, int(port))
            async with proxy as address, service("kakeya", address, tmp / mode) as client:
                out[f"session, {mode} (kakeya)"] = await conversation(client, proxy, turns, mode)
            out["engine_sessions"][f"session, {mode} (kakeya)"] = rt.store.created
        async with serve_app(create_fake_openai()) as base:
            host, port = base.removeprefix("http://").rsplit(":", 1)
            proxy = CountingProxy(host, int(port))
            async with proxy as address:
                url = f"http://{address}/v1"
                async with service("openai", url, tmp / mode) as client:
                    out[f"resend, {mode} (openai)"] = await conversation(client, proxy, turns, mode)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sessions.json"))
    a = ap.parse_args()
    out = asyncio.run(main_async(a.turns))
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    opened = out["engine_sessions"]
    print(
        "| | engine sessions | bytes to the engine, turn 1 | turn 20 | all turns |"
        " time per turn (median) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, rows in out.items():
        if name in ("turns", "engine_sessions"):
            continue
        print(
            f"| {name} | {opened.get(name, '-')} | {rows[0]['bytes']:,} | {rows[-1]['bytes']:,} | "
            f"{sum(x['bytes'] for x in rows):,} | "
            f"{statistics.median(x['s'] for x in rows) * 1000:.1f} ms |"
        )
    print()
    for mode in MODES:
        s, r = out[f"session, {mode} (kakeya)"], out[f"resend, {mode} (openai)"]
        print(
            f"{mode}: turn {a.turns} session/resend bytes = {s[-1]['bytes'] / r[-1]['bytes']:.3f}"
        )


if __name__ == "__main__":
    main()
