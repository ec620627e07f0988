"""OpenAI-compatible HTTP engines: vLLM, llama.cpp server, SGLang, TGI, Ollama.

Prompts go to ``/completions`` and messages to ``/chat/completions``, streamed
(``stream: true`` with ``stream_options.include_usage``). Each streamed chunk that carries
text is one token event; usage comes from the final chunk. Requests go through
``worker_adapters/http1.py`` (a keep-alive pool per engine); its errors never leave this
module: they become :class:`EngineUnavailable` (cannot connect) or :class:`EngineFailure`
(the engine answered badly), ``retriable`` where a retry can help. Cancelling closes the
upstream response, which is how these servers learn to free the slot. The API key is sent as
a bearer token and appears nowhere else (not in reprs, logs, errors or events).

What an engine sends is bounded as it is read: the stream is split into lines in linear time,
and a line longer than one token's JSON at ``max_token_bytes`` can be (:func:`line_cap`) ends
the call (:class:`EngineOverLimit`, ``token_too_large``) without being buffered further; an
error body is read up to ``max_error_bytes``, the rest left unread. An answer 429 or 503 with
``Retry-After`` carries it as ``retry_after_ms`` for the step to wait and ask again.
"""

from __future__ import annotations

import hashlib
import json
import logging
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
from worker_adapters.errors import AdapterError, EngineFailure, EngineOverLimit, EngineUnavailable
from worker_adapters.http1 import ConnectFailed, Http1Client, HttpError, Response, TimedOut
from worker_adapters.registry import EngineDefaults, EngineVariant, ReplicaConfig, UrlForms

log = logging.getLogger(__name__)

_FEATURES = ("seed", "stop", "logprobs", "json_schema", "chat")
# the most a refresh waits for the model list (less where the adapter's read timeout is less)
_MODELS_TIMEOUT_S = 5.0
# the most of a model list read (thousands of entries); a longer one is not JSON to us
_MODELS_MAX_BYTES = 1 << 20
# the most of an engine's error message shown in a step's error
_DETAIL_CHARS = 1000

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
        context_size: int | None = None,
        max_token_bytes: int = 64 << 10,
        max_error_bytes: int = 64 << 10,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._max_token_bytes = max_token_bytes
        self._max_line_bytes = line_cap(max_token_bytes)
        self._max_error_bytes = max_error_bytes
        self.model = model
        self._pinned_hash = model_hash
        self._context_size = context_size  # the operator's; else the engine's, if it tells
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
                    answer = await response.read(self._max_error_bytes)
                    raise _status_error(response.status, answer, response.retry_after_ms())
                async for payload in self._data_lines(response):
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
            status, _ = await self._client.request(
                "GET", f"{root}/health", timeout_s=3, max_bytes=self._max_error_bytes
            )
            if status == 404:
                status, _ = await self._client.request(
                    "GET", f"{self._prefix}/models", timeout_s=3, max_bytes=_MODELS_MAX_BYTES
                )
        except HttpError as exc:
            return Health(live=False, ready=False, detail=f"{type(exc).__name__}")
        if status == 200:
            return Health(live=True, ready=True)
        return Health(live=True, ready=False, detail=f"HTTP {status}")

    async def capabilities(self) -> Capabilities:
        """What ``GET /v1/models`` tells: every model id the engine serves, and the context
        size where it reports one (vLLM and SGLang: ``max_model_len``; llama.cpp's own
        server: ``meta.n_ctx``, else ``meta.n_ctx_train``, the model's trained size;
        llama-cpp-python's server reports none). A configured ``context_size`` wins.

        An engine that cannot be reached raises :class:`EngineUnavailable`: nothing is known
        of it yet (the pool shows what its pools file declares). One that answers, but not
        with a model list (an HTTP error, a body that is not one), gives capabilities from
        the configuration alone, asked again at the next refresh; a model list is kept."""
        if self._caps is not None:
            return self._caps
        entries = await self._listed_models()
        if entries is None:
            return self._configured_caps()
        entry = next((m for m in entries if m["id"] == self.model), entries[0] if entries else {})
        # Remote servers do not publish file hashes: the model entry identifies the model,
        # unless the operator pins the real hash in the pools file.
        model_hash = self._pinned_hash or _sha256_of(_stable(entry))
        found = entry.get("meta")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        extra: dict[str, Any] = {"base_url": self.base_url}
        # llama.cpp's server: the model's parameters, its weights' bytes, its trained context
        for key, name in (
            ("n_params", "n_params"),
            ("size", "model_size_bytes"),
            ("n_ctx_train", "n_ctx_train"),
        ):
            if _count(meta.get(key)):
                extra[name] = meta[key]
        reported = (
            _count(entry.get("max_model_len"))
            or _count(meta.get("n_ctx"))
            or _count(meta.get("n_ctx_train"))
        )
        self._caps = Capabilities(
            engine="openai",
            engine_version=str(entry.get("owned_by") or "openai-compatible"),
            model=str(entry.get("id") or self.model or "unknown"),
            models=tuple(sorted({m["id"] for m in entries})),
            model_hash=model_hash,
            context_size=self._context_size or reported,
            features=_FEATURES,
            extra=extra,
        )
        return self._caps

    async def _listed_models(self) -> list[dict[str, Any]] | None:
        """The entries of ``GET /v1/models`` that have an id; None when the engine answered
        something else (logged as a warning naming the address without credentials)."""
        url = f"{self._shown}/models"
        timeout = min(self._client.read_timeout_s, _MODELS_TIMEOUT_S)
        try:
            status, raw = await self._client.request(
                "GET", f"{self._prefix}/models", timeout_s=timeout, max_bytes=_MODELS_MAX_BYTES
            )
        except HttpError as exc:
            raise EngineUnavailable(f"{url}: {type(exc).__name__}") from exc
        if status != 200:
            log.warning("%s: HTTP %d; capabilities from the configuration", url, status)
            return None
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.warning("%s: not JSON; capabilities from the configuration", url)
            return None
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            log.warning("%s: no model list; capabilities from the configuration", url)
            return None
        entries = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if len(entries) < len(data):
            log.debug("%s: %d entries without an id left out", url, len(data) - len(entries))
        return entries

    def _configured_caps(self) -> Capabilities:
        """Capabilities from the configuration alone (the engine's model list unread): not
        kept, so the next refresh asks the engine again."""
        identity = {"engine": self.kind, "model": self.model}
        return Capabilities(
            engine="openai",
            engine_version="openai-compatible",
            model=self.model or "",
            model_hash=self._pinned_hash or _sha256_of(identity),
            context_size=self._context_size or 0,
            features=_FEATURES,
            extra={"base_url": self.base_url},
        )

    async def _data_lines(self, response: Response) -> AsyncIterator[bytes]:
        """The payloads of the SSE ``data:`` lines, split from raw bytes (no text decoding)
        in time linear in the bytes: each block is split once, and the piece of a line that
        a block leaves open is held until the line ends, never joined and split again. A
        line past :func:`line_cap` ends the call as soon as the held bytes pass it."""
        cap = self._max_line_bytes
        held: list[bytes] = []
        held_bytes = 0
        async for block in response.chunks():
            lines = block.split(b"\n")
            rest = lines.pop()
            if held and lines:  # the block's first line ends the line held
                lines[0] = b"".join([*held, lines[0]])
                held, held_bytes = [], 0
            for line in lines:
                if len(line) > cap:
                    raise self._line_too_long()
                if line.startswith(b"data:"):
                    yield line[5:].strip()
            if rest:
                held.append(rest)
                held_bytes += len(rest)
                if held_bytes > cap:
                    raise self._line_too_long()
        last = b"".join(held)
        if last.startswith(b"data:"):
            yield last[5:].strip()

    def _line_too_long(self) -> EngineOverLimit:
        return EngineOverLimit(
            f"the engine sent a stream line of over {self._max_line_bytes} bytes, more than"
            f" a token of engine_limits.max_token_bytes ({self._max_token_bytes}) can take;"
            " it was not read further",
            reason="token_too_large",
            limit="engine_limits.max_token_bytes",
            retriable=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()


# What a model entry says that is not the model: when it was listed (a fresh ``created`` on
# each request from vLLM and llama.cpp's servers) and its per-request permission objects.
_VOLATILE = frozenset({"created", "permission", "permissions"})


def _stable(entry: dict[str, Any]) -> dict[str, Any]:
    """A model entry less what changes between two listings of the same model."""
    return {k: v for k, v in entry.items() if k not in _VOLATILE}


def _sha256_of(value: dict[str, Any]) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _count(value: Any) -> int:
    """``value`` if it is a positive integer (not a bool), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def line_cap(max_token_bytes: int) -> int:
    """The longest stream line read for tokens of ``max_token_bytes``: JSON may write each
    byte of a token as six (``\\u0000``), and a line carries its chunk's other fields
    (logprobs and their alternatives, usage) besides: 64 KiB for them."""
    return 6 * max_token_bytes + (64 << 10)


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
    text = str(error.get("message") or error) if isinstance(error, dict) else str(error)
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + "..."


def _status_error(status: int, body: bytes, retry_after_ms: int | None) -> EngineFailure:
    """An answer >= 400 as an error: its message (from the body, which the caller read up to
    a cap), retriable where a retry can help, and how long the engine asked to wait (429 and
    503 only, the statuses RFC 9110 gives ``Retry-After`` a retry's meaning on)."""
    text = body.decode("utf-8", "replace")
    try:
        decoded = orjson.loads(body)
        detail = _error_text(decoded.get("error") or text if isinstance(decoded, dict) else text)
    except orjson.JSONDecodeError:
        detail = text[:200]
    retriable = status in (408, 429) or status >= 500
    return EngineFailure(
        f"engine answered HTTP {status}: {detail}",
        retriable=retriable,
        retry_after_ms=retry_after_ms if status in (429, 503) else None,
    )


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
    context_size: int | None = Field(
        default=None,
        ge=1,
        description="the engine's context size in tokens; default: what its /v1/models"
        " reports (vLLM, SGLang, llama.cpp's server), else unknown",
    )


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
        context_size=options.context_size,
        max_token_bytes=defaults.max_token_bytes,
        max_error_bytes=defaults.max_error_bytes,
    )


VARIANT = EngineVariant(
    adapter=OpenAIAdapter,
    options=OpenAIOptions,
    build=_build,
    url=UrlForms(needs="its base url", examples=("http://host:8000/v1",)),
)
