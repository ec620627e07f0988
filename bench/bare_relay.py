"""The baseline for ``bench/relay.py``: a bare Starlette SSE relay of the sim engine.

``GET /stream?max_tokens=N&seed=S&prompt=P&flush=F`` streams one SSE frame per event
(``started``, one ``token`` per token, ``end``) straight from ``SimAdapter.stream``, with the
same framing (``id:``/``event:``/``data:``) and the same orjson payload shape as
orchestratord's step events. No database, no hub, no dispatcher: what is left is the engine,
JSON encoding, Starlette and uvicorn, i.e. the cost any relay pays.

``flush`` is how many frames go into one write: 1 writes every frame on its own; the default
16 matches the sim's own granularity (it yields to the event loop every 16 tokens when it
runs as fast as possible), so a flush never holds a token back behind an idle loop.

Run: ``python bench/bare_relay.py --port P`` (127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import uuid

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator_core.generation import normalize_llm_input
from worker_adapters import Finish, GenerationRequest, Token
from worker_adapters.sim import SimAdapter

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}

adapter = SimAdapter(tokens_per_s=0, eos_probability=0)


def _frame(seq: int, etype: str, body: dict[str, object]) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, etype.encode(), orjson.dumps(body))


async def healthz(_request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def stream(request: Request) -> Response:
    q = request.query_params
    sid = q.get("id") or f"bare_{uuid.uuid4().hex}"
    flush = max(1, int(q.get("flush", "16")))
    llm = normalize_llm_input(
        prompt=q.get("prompt", "hello"),
        messages=None,
        params={"max_tokens": int(q.get("max_tokens", "16"))},
        model=None,
    )
    p = llm.params
    req = GenerationRequest(
        request_id=sid,
        prompt=llm.prompt,
        messages=None,
        seed=int(q.get("seed", "1")),
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        stop=p.stop,
        model=None,
    )

    async def body():  # type: ignore[no-untyped-def]
        seq = 0
        buf = [
            _frame(
                seq,
                "started",
                {
                    "step_id": sid,
                    "seq": seq,
                    "type": "started",
                    "pool_id": "bare",
                    "replica_id": "bare-0",
                    "engine": "sim",
                },
            )
        ]
        i = 0
        gen = adapter.stream(req)
        try:
            async for item in gen:
                if isinstance(item, Token):
                    seq += 1
                    buf.append(
                        _frame(
                            seq,
                            "token",
                            {
                                "step_id": sid,
                                "seq": seq,
                                "type": "token",
                                "i": i,
                                "t": item.text,
                                "token_id": item.token_id,
                            },
                        )
                    )
                    i += 1
                    if len(buf) >= flush:
                        yield b"".join(buf)
                        buf = []
                elif isinstance(item, Finish):
                    seq += 1
                    buf.append(
                        _frame(
                            seq,
                            "end",
                            {
                                "step_id": sid,
                                "seq": seq,
                                "type": "end",
                                "stop_reason": item.stop_reason,
                                "tokens_in": item.tokens_in,
                                "tokens_out": item.tokens_out,
                            },
                        )
                    )
        finally:
            await gen.aclose()
        if buf:
            yield b"".join(buf)

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


app = Starlette(routes=[Route("/healthz", healthz), Route("/stream", stream)])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5
    )


if __name__ == "__main__":
    main()
