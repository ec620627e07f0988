"""Wire bytes the Evergreen adapter sends per turn: one session per conversation against
resending the whole conversation each turn.

A conversation of ``--turns`` turns (20 tokens generated a turn, the sim engine on the
reference Evergreen server, ``test_harness.evergreen_runtime``) is driven through
``worker_adapters.evergreen`` with its turns built two ways:

* **prompt**: each prompt is the conversation so far (prompts and replies) plus a new line;
* **chat**: each request's messages are the conversation so far (a system message, then user
  and assistant messages) plus a new user message;

and sent two ways:

* **session**: every turn carries the same engine session (as a run's steps do): the adapter
  keeps one Evergreen session open and each turn names the previous turn's prompt and
  response nodes and sends only the new text;
* **resend**: no session: each turn opens a session of its own and sends the whole
  conversation (what a client that keeps no session must do).

The adapter dials the server through a counting TCP proxy: **wire bytes** are every byte the
adapter sent in a turn (gRPC over HTTP/2, framing, flow control and a new stream's headers
included). The server also counts the serialized ``SessionMessage`` bytes it received.

    .venv/bin/python bench/evergreen_wire.py [--turns 20]

Writes ``bench/results/evergreen_wire.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sessions import CountingProxy  # noqa: E402
from test_harness.evergreen_runtime import serve_evergreen  # noqa: E402
from worker_adapters.base import GenerationRequest, Token  # noqa: E402
from worker_adapters.evergreen import EvergreenAdapter  # noqa: E402
from worker_adapters.sim import SimAdapter  # noqa: E402

MAX_TOKENS = 20
SYSTEM = "You plan the steps of a flow and call its tools when a step needs one."
LINES = [
    "alpha beta gamma delta echo fox golf hotel ",
    "delta echo alpha fox beta gamma what is the plan for this step? ",
]
KINDS = ("prompt", "chat")
WAYS = ("session", "resend")


def request(kind: str, conversation: Any, turn: int, session: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"turn-{turn}",
        prompt=conversation if kind == "prompt" else None,
        messages=tuple(conversation) if kind == "chat" else None,
        seed=1,
        max_tokens=MAX_TOKENS,
        session=session,
    )


async def conversation(kind: str, way: str, turns: int) -> list[dict[str, Any]]:
    engine = SimAdapter(tokens_per_s=0, eos_probability=0.0)  # every turn makes 20 tokens
    async with serve_evergreen(engine=engine) as server:
        host, port = server.address.rsplit(":", 1)
        proxy = CountingProxy(host, int(port))
        async with proxy as address:
            adapter = EvergreenAdapter(target=address, model="sim-1")
            session = adapter.open_session() if way == "session" else None
            convo: Any = (
                LINES[0]
                if kind == "prompt"
                else [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": LINES[0]},
                ]
            )
            rows = []
            try:
                for turn in range(turns):
                    before = proxy.sent
                    received = sum(s.bytes_received for s in server.sessions)
                    t0 = time.perf_counter()
                    events = [e async for e in adapter.stream(request(kind, convo, turn, session))]
                    elapsed = time.perf_counter() - t0
                    await asyncio.sleep(0.01)  # the proxy forwards what was written
                    reply = "".join(e.text for e in events if isinstance(e, Token))
                    size = len(convo) if kind == "prompt" else sum(len(m["content"]) for m in convo)
                    rows.append(
                        {
                            "wire_bytes": proxy.sent - before,
                            "message_bytes": sum(s.bytes_received for s in server.sessions)
                            - received,
                            "conversation_chars": size,
                            "s": elapsed,
                        }
                    )
                    line = LINES[(turn + 1) % 2] + f"({turn + 1}) "
                    if kind == "prompt":
                        convo = convo + reply + line
                    else:
                        convo = [
                            *convo,
                            {"role": "assistant", "content": reply},
                            {"role": "user", "content": line},
                        ]
            finally:
                await adapter.aclose()
            rows[-1]["sessions_opened"] = server.counters.sessions_opened
    return rows


async def main_async(turns: int) -> dict[str, Any]:
    out: dict[str, Any] = {"turns": turns, "max_tokens": MAX_TOKENS}
    for kind in KINDS:
        for way in WAYS:
            out[f"{way}, {kind}"] = await conversation(kind, way, turns)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "evergreen_wire.json"))
    a = ap.parse_args()
    out = asyncio.run(main_async(a.turns))
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"| | sessions opened | wire bytes, turn 1 | turn {a.turns} | all turns |"
        f" messages, turn {a.turns} | time per turn (median) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rows in out.items():
        if not isinstance(rows, list):
            continue
        print(
            f"| {name} | {rows[-1]['sessions_opened']} | {rows[0]['wire_bytes']:,} | "
            f"{rows[-1]['wire_bytes']:,} | {sum(r['wire_bytes'] for r in rows):,} | "
            f"{rows[-1]['message_bytes']:,} | "
            f"{statistics.median(r['s'] for r in rows) * 1000:.1f} ms |"
        )
    print()
    for kind in KINDS:
        s, r = out[f"session, {kind}"][-1], out[f"resend, {kind}"][-1]
        print(
            f"{kind}: turn {a.turns} session/resend wire bytes = "
            f"{s['wire_bytes'] / r['wire_bytes']:.3f} ({s['wire_bytes']:,} / {r['wire_bytes']:,})"
        )


if __name__ == "__main__":
    main()
