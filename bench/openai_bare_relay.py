"""A bare relay of an OpenAI-compatible engine to SSE: the baseline for bench/openai_relay.py.

Starlette + httpx, no persistence, no bookkeeping: for each upstream chunk it parses the
JSON and writes one SSE token frame, as orchestratord's adapter and stream would.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route


def build(upstream: str) -> Starlette:
    client = httpx.AsyncClient(
        base_url=upstream, timeout=60, limits=httpx.Limits(max_connections=1000)
    )

    async def relay(request: Request) -> StreamingResponse:
        n = int(request.query_params.get("tokens", "100"))

        async def frames() -> AsyncIterator[bytes]:
            body = {
                "model": "fake-model",
                "prompt": "x",
                "max_tokens": n,
                "stream": True,
                "seed": 1,
            }
            i = 0
            async with client.stream("POST", "/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line.endswith("[DONE]"):
                        continue
                    for choice in json.loads(line[5:]).get("choices") or []:
                        text = choice.get("text")
                        if text:
                            data = orjson.dumps({"seq": i + 1, "type": "token", "i": i, "t": text})
                            yield b"id: %d\nevent: token\ndata: %s\n\n" % (i + 1, data)
                            i += 1
            yield b"event: end\ndata: {}\n\n"

        return StreamingResponse(frames(), media_type="text/event-stream")

    return Starlette(routes=[Route("/relay", relay)])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    args = ap.parse_args()
    uvicorn.run(build(args.upstream), host="127.0.0.1", port=args.port, log_level="warning")
