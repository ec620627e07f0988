"""A fake OpenAI-compatible server with fault injection.

Tokens are a pure function of the request (prompt or messages, seed, max_tokens), so a test
can compare what went through orchestratord with what the fake would say directly. Faults:
``refuse`` is simply not running it; the others are set on :class:`Faults`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

WORDS = ("alpha ", "beta ", "gamma ", "delta ", "echo ", "fox ", "golf ", "hotel ")


@dataclass
class Faults:
    status: int | None = None  # answer every generation with this HTTP status
    cut_after: int | None = None  # close the stream after this many chunks, no [DONE]
    first_byte_delay_s: float = 0.0
    malformed_at: int | None = None  # send a chunk that is not JSON at this index
    token_delay_s: float = 0.0
    hold_after_done_s: float = 0.0  # keep the body open this long after [DONE]
    models_status: int | None = None  # answer GET /v1/models with this HTTP status
    models_body: bytes | None = None  # answer GET /v1/models 200 with these bytes instead


@dataclass
class FakeState:
    faults: Faults = field(default_factory=Faults)
    model: str = "fake-model"
    also_serves: tuple[str, ...] = ()  # more models /v1/models lists, after ``model``
    max_model_len: int = 2048  # each model's context, as vLLM reports it
    active: int = 0
    peak_active: int = 0  # the most generations it streamed at once
    disconnects: int = 0
    completed: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    auth_headers: list[str | None] = field(default_factory=list)
    models_auth: list[str | None] = field(default_factory=list)  # one per GET /v1/models
    listings: int = 0  # GET /v1/models answered
    client_ports: list[int] = field(default_factory=list)  # one per connection it came on
    # generations streamed to their end, per prompt: the engine-side count of executions
    completed_by_prompt: Counter[str] = field(default_factory=Counter)


def fake_tokens(body: dict[str, Any]) -> list[str]:
    material = json.dumps(
        {k: body.get(k) for k in ("prompt", "messages", "seed", "temperature", "top_p")},
        sort_keys=True,
    ).encode()
    digest = hashlib.sha256(material).digest()
    n = int(body.get("max_tokens") or 16)
    return [WORDS[digest[i % len(digest)] % len(WORDS)] for i in range(n)]


def create_fake_openai(state: FakeState | None = None) -> Starlette:
    st = state or FakeState()

    async def models(request: Request) -> Response:
        st.models_auth.append(request.headers.get("authorization"))
        f = st.faults
        if f.models_status is not None:
            return JSONResponse(
                {"error": {"message": "injected failure", "code": f.models_status}},
                status_code=f.models_status,
            )
        if f.models_body is not None:
            return Response(f.models_body, media_type="application/json")
        served = (st.model, *st.also_serves)
        st.listings += 1  # as vLLM does, each listing says when it was made
        entry = {
            "object": "model",
            "owned_by": "fake",
            "max_model_len": st.max_model_len,
            "created": 1_700_000_000 + st.listings,
        }
        return JSONResponse({"object": "list", "data": [{"id": m, **entry} for m in served]})

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def generate(request: Request) -> Response:
        body = await request.json()
        st.requests.append(body)
        st.auth_headers.append(request.headers.get("authorization"))
        st.client_ports.append(request.client.port if request.client else -1)
        f = st.faults
        if f.status is not None:
            return JSONResponse(
                {"error": {"message": "injected failure", "code": f.status}}, status_code=f.status
            )
        chat = request.url.path.endswith("/chat/completions")
        tokens = fake_tokens(body)
        return StreamingResponse(_events(body, tokens, chat), media_type="text/event-stream")

    async def _events(body: dict[str, Any], tokens: list[str], chat: bool) -> AsyncIterator[bytes]:
        f = st.faults
        st.active += 1
        st.peak_active = max(st.peak_active, st.active)
        finished = False
        try:
            if f.first_byte_delay_s:
                await asyncio.sleep(f.first_byte_delay_s)
            for i, tok in enumerate(tokens):
                if f.cut_after is not None and i >= f.cut_after:
                    return
                if f.malformed_at is not None and i == f.malformed_at:
                    yield b"data: {not json\n\n"
                    continue
                if f.token_delay_s:
                    await asyncio.sleep(f.token_delay_s)
                choice: dict[str, Any] = (
                    {"index": 0, "delta": {"content": tok}, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": tok, "finish_reason": None}
                )
                yield b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"
            last: dict[str, Any] = (
                {"index": 0, "delta": {}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": "", "finish_reason": "length"}
            )
            yield b"data: " + json.dumps({"choices": [last]}).encode() + b"\n\n"
            prompt_tokens = len(json.dumps(body.get("prompt") or body.get("messages")).split())
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(tokens),
                "total_tokens": prompt_tokens + len(tokens),
            }
            yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            finished = True
            if f.hold_after_done_s:
                await asyncio.sleep(f.hold_after_done_s)
        finally:
            st.active -= 1
            if finished:
                st.completed += 1
                st.completed_by_prompt[str(body.get("prompt") or body.get("messages"))] += 1
            else:
                st.disconnects += 1

    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/health", health),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/chat/completions", generate, methods=["POST"]),
        ]
    )
    app.state.fake = st
    return app
