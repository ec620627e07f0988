"""OpenAI-compatible HTTP engines: vLLM, llama.cpp server, SGLang, TGI, Ollama.

Prompts go to ``/completions`` and messages to ``/chat/completions``, streamed
(``stream: true`` with ``stream_options.include_usage``). Each streamed chunk that carries
text is one token event; usage comes from the final chunk. Requests go through
``worker_adapters/http1.py`` (a keep-alive pool per engine); its errors never leave this
module: they become :class:`EngineUnavailable` (cannot connect) or :class:`EngineFailure`
(the engine answered badly), ``retriable`` where a retry can help. Cancelling closes the
upstream response, which is how these servers learn to free the slot. The API key is sent as
a bearer token and appears nowhere else (not in reprs, logs, errors or events).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable
from worker_adapters.http1 import ConnectFailed, Http1Client, HttpError, Response, TimedOut
from worker_adapters.registry import EngineDefaults, EngineVariant, ReplicaConfig, UrlForms

_FINISH = {
    "length": "length",
    "stop": "eos",
    "eos": "eos",
    "eos_token": "eos",
    "stop_sequence": "stop",
    "content_filter": "stop",
    "tool_calls": "eos",
}


class OpenAIAdapter(WorkerAdapter):
    kind = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        model_hash: str | None = None,
        connections: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._pinned_hash = model_hash
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # what this adapter sends as a credential, for the control plane to mask wherever
        # an engine's reply (an error quoting the request) would show it
        self.secrets: tuple[str, ...] = (api_key,) if api_key else ()
        # one kept-alive connection per slot (plus health checks): a connection closed after
        # each generation would cost a TCP handshake on the next one's TTFT
        self._client = Http1Client(
            self.base_url,
            headers=headers,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            connections=connections + 2,
        )
        self._prefix = self._client.prefix
        # for messages: the URL without its user, password or query
        self._shown = self._client.url(self._prefix)
        self._open: dict[str, Response] = {}
        self._caps: Capabilities | None = None

    def __repr__(self) -> str:
        return f"OpenAIAdapter(base_url={self.base_url!r}, model={self.model!r})"

    def _body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": request.model or self.model or "default",
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "seed": request.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.top_k:
            body["top_k"] = request.top_k
        if request.stop:
            body["stop"] = list(request.stop)
        if request.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": request.json_schema},
            }
        if request.messages is not None:
            body["messages"] = [dict(m) for m in request.messages]
            if request.logprobs:
                body["logprobs"] = True
            return "/chat/completions", body
        body["prompt"] = request.prompt or ""
        if request.logprobs:
            body["logprobs"] = 1
        return "/completions", body

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        path, body = self._body(request)
        sent = 0
        usage: dict[str, Any] = {}
        finish: str | None = None
        done = False
        try:
            async with self._client.stream(
                "POST", self._prefix + path, body=orjson.dumps(body)
            ) as response:
                self._open[request.request_id] = response
                if response.status >= 400:
                    raise _status_error(response.status, await response.read())
                async for payload in _data_lines(response):
                    if done:  # read to the end of the body: the connection goes back to the pool
                        continue
                    if payload == b"[DONE]":
                        done = True
                        continue
                    chunk = _parse_chunk(payload)
                    if chunk.get("error"):
                        raise EngineFailure(
                            f"engine error: {_error_text(chunk['error'])}", retriable=True
                        )
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        text, logprob = _choice_text(choice)
                        if text:
                            sent += 1
                            yield Token(text=text, token_id=None, logprob=logprob)
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
        except AdapterError:
            raise
        except ConnectFailed as exc:
            raise EngineUnavailable(str(exc)) from exc  # "cannot connect to <url>: <why>"
        except TimedOut as exc:
            if not done:  # after [DONE] only the end of the body was missing
                raise EngineFailure(f"timed out: {exc}", retriable=True) from exc
        except HttpError as exc:
            if not done:
                raise EngineFailure(f"the stream broke: {exc}", retriable=True) from exc
        finally:
            self._open.pop(request.request_id, None)
        if not done and finish is None:
            raise EngineFailure("the engine closed the stream before it finished", retriable=True)
        stop_reason = _FINISH.get(finish or "stop", "eos")
        if stop_reason == "eos" and finish == "stop" and request.stop:
            stop_reason = "stop"  # the protocol does not tell a stop string from EOS
        yield Finish(
            stop_reason=stop_reason,
            tokens_in=int(usage.get("prompt_tokens") or 0),
            tokens_out=int(usage.get("completion_tokens") or sent),
        )

    async def cancel(self, request_id: str) -> None:
        response = self._open.pop(request_id, None)
        if response is not None:
            response.close()  # closes the connection: the engine frees the slot

    async def health(self) -> Health:
        root = self._prefix.removesuffix("/v1")
        try:
            status, _ = await self._client.request("GET", f"{root}/health", timeout_s=3)
            if status == 404:
                status, _ = await self._client.request("GET", f"{self._prefix}/models", timeout_s=3)
        except HttpError as exc:
            return Health(live=False, ready=False, detail=f"{type(exc).__name__}")
        if status == 200:
            return Health(live=True, ready=True)
        return Health(live=True, ready=False, detail=f"HTTP {status}")

    async def capabilities(self) -> Capabilities:
        if self._caps is not None:
            return self._caps
        try:
            status, raw = await self._client.request("GET", f"{self._prefix}/models", timeout_s=5)
            if status != 200:
                raise EngineUnavailable(f"{self._shown}/models: HTTP {status}")
            models = orjson.loads(raw).get("data") or []
        except (HttpError, ValueError, AttributeError) as exc:
            raise EngineUnavailable(f"{self._shown}/models: {type(exc).__name__}") from exc
        entry = next((m for m in models if m.get("id") == self.model), models[0] if models else {})
        # Remote servers do not publish file hashes: the model entry identifies the model,
        # unless the operator pins the real hash in the pools file.
        model_hash = (
            self._pinned_hash
            or "sha256:"
            + hashlib.sha256(
                json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest()
        )
        self._caps = Capabilities(
            engine="openai",
            engine_version=str(entry.get("owned_by") or "openai-compatible"),
            model=str(entry.get("id") or self.model or "unknown"),
            model_hash=model_hash,
            context_size=int(
                (entry.get("meta") or {}).get("n_ctx_train") or entry.get("max_model_len") or 0
            ),
            features=("seed", "stop", "logprobs", "json_schema", "chat"),
            extra={"base_url": self.base_url},
        )
        return self._caps

    async def aclose(self) -> None:
        await self._client.aclose()


async def _data_lines(response: Response) -> AsyncIterator[bytes]:
    """The payloads of the SSE ``data:`` lines, split from raw bytes (no text decoding)."""
    pending = b""
    async for block in response.chunks():
        pending += block
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if pending.startswith(b"data:"):
        yield pending[5:].strip()


def _parse_chunk(payload: bytes) -> dict[str, Any]:
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise EngineFailure(f"malformed stream chunk: {payload[:80]!r}", retriable=True) from exc
    if not isinstance(chunk, dict):
        raise EngineFailure(f"malformed stream chunk: {payload[:80]!r}", retriable=True)
    return chunk


def _choice_text(choice: dict[str, Any]) -> tuple[str, float | None]:
    if "delta" in choice:
        text = (choice.get("delta") or {}).get("content") or ""
    else:
        text = choice.get("text") or ""
    logprob = None
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        values = lp.get("token_logprobs") or [
            c.get("logprob") for c in (lp.get("content") or []) if isinstance(c, dict)
        ]
        if values and isinstance(values[0], (int, float)):
            logprob = float(values[0])
    return text, logprob


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def _status_error(status: int, body: bytes) -> EngineFailure:
    text = body.decode("utf-8", "replace")
    try:
        decoded = orjson.loads(body)
        detail = _error_text(decoded.get("error") or text if isinstance(decoded, dict) else text)
    except orjson.JSONDecodeError:
        detail = text[:200]
    retriable = status in (408, 429) or status >= 500
    return EngineFailure(f"engine answered HTTP {status}: {detail}", retriable=retriable)


class OpenAIOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_key: str | None = Field(
        default=None, description="sent as a bearer token; shown nowhere (logs, errors, events)"
    )
    model_hash: str | None = Field(
        default=None, description="the model's hash as provenance names it; default: derived"
    )
    connect_timeout_s: float = Field(default=5.0, description="seconds to open a connection")
    read_timeout_s: float = Field(default=60.0, description="seconds to wait for each read")


def _build(
    replica: ReplicaConfig, options: OpenAIOptions, defaults: EngineDefaults
) -> OpenAIAdapter:
    return OpenAIAdapter(
        base_url=replica.required_address,
        model=replica.model,
        api_key=options.api_key,
        model_hash=options.model_hash,
        connect_timeout_s=options.connect_timeout_s,
        read_timeout_s=options.read_timeout_s,
        connections=replica.slots,
    )


VARIANT = EngineVariant(
    adapter=OpenAIAdapter,
    options=OpenAIOptions,
    build=_build,
    url=UrlForms(needs="its base url", examples=("http://host:8000/v1",)),
)
