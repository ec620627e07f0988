"""The deterministic simulated engine.

Tokens are a pure function of (prompt, sampling params, seed): a SHA-256 of the three seeds a
PRNG that picks words from a fixed vocabulary and decides where the sequence ends. It can run
at a given token rate or as fast as possible (``tokens_per_s=0``), for benchmarks.

A request with a ``json_schema`` gets JSON for it instead (``sim_json``, seeded from the same
material plus the schema), imperfect on purpose: each object breaks its schema with
probability ``schema_error_probability`` (default 0.2) and each string ``const`` becomes
``"unknown_tool"`` with probability ``unknown_tool_probability`` (default 0.05). Requests
without a schema are untouched by these settings.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
from collections.abc import AsyncGenerator, AsyncIterator

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
from worker_adapters.registry import EngineDefaults, EngineVariant, ReplicaConfig
from worker_adapters.sim_json import SchemaSampler, json_pieces
from worker_adapters.stops import StopMatcher

SIM_VERSION = "1.0"
DEFAULT_SCHEMA_ERROR_PROBABILITY = 0.2
DEFAULT_UNKNOWN_TOOL_PROBABILITY = 0.05
_WORDS = (
    "the of and to in is that it for on was with as by be this are or at from an not but have "
    "all which one were their they there can more will would about when so what up out into "
    "plan step tool call fact gate run flow seed token stream replay model pool budget policy "
    "alpha beta gamma delta light river stone cloud signal vector prime orbit lattice. , ! ?"
).split()
VOCAB: tuple[str, ...] = tuple(w + " " for w in _WORDS)
_PIECE = re.compile(r"\S+\s*|\s+")
# Yield to the event loop this often when streaming as fast as possible.
_FAST_YIELD_EVERY = 16


async def _through_stops(
    request: GenerationRequest, source: AsyncIterator[Token | str]
) -> AsyncIterator[AdapterEvent]:
    """``source``'s tokens cut at the request's stop strings, then the :class:`Finish`. The
    source ends with why it ended (``"eos"``, ``"length"``); one that ends without saying
    was cancelled, and the stream just ends."""
    matcher = StopMatcher(request.stop)
    sent = 0
    stop_reason: str | None = None
    async for item in source:
        if isinstance(item, str):
            stop_reason = item
            break
        for tok in matcher.push(item):
            sent += 1
            yield tok
        if matcher.stopped:
            stop_reason = "stop"
            break
    if stop_reason is None:
        return
    for tok in matcher.flush():
        sent += 1
        yield tok
    tokens_in = sim_token_count(request.rendered_prompt())
    yield Finish(stop_reason=stop_reason, tokens_in=tokens_in, tokens_out=sent)


def sim_token_count(text: str) -> int:
    return len(_PIECE.findall(text))


def _hash_of(identity: dict[str, object]) -> str:
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class SimAdapter(WorkerAdapter):
    kind = "sim"

    def __init__(
        self,
        *,
        tokens_per_s: float = 50.0,
        eos_probability: float = 0.02,
        model: str = "sim-1",
        context_size: int = 8192,
        schema_error_probability: float = DEFAULT_SCHEMA_ERROR_PROBABILITY,
        unknown_tool_probability: float = DEFAULT_UNKNOWN_TOOL_PROBABILITY,
    ) -> None:
        if tokens_per_s < 0:
            raise ValueError("tokens_per_s must be >= 0 (0 streams as fast as possible)")
        self.tokens_per_s = float(tokens_per_s)
        self.eos_probability = float(eos_probability)
        self.model = model
        self.context_size = context_size
        self.schema_error_probability = float(schema_error_probability)
        self.unknown_tool_probability = float(unknown_tool_probability)
        self._cancelled: set[str] = set()
        self._active: set[str] = set()
        self.cut_short = 0
        """Generations that stopped before their end: cancelled, or their reader gone."""
        identity: dict[str, object] = {
            "engine": "sim",
            "version": SIM_VERSION,
            "vocab": VOCAB,
            "eos_probability": self.eos_probability,
            "model": model,
        }
        # Plain sampling is seeded by this identity alone, so the JSON settings never move
        # plain tokens; they join model_hash only when changed, so the default engine keeps
        # the hash that recorded runs were made with.
        self._sampling_hash = _hash_of(identity)
        if self.schema_error_probability != DEFAULT_SCHEMA_ERROR_PROBABILITY:
            identity["schema_error_probability"] = self.schema_error_probability
        if self.unknown_tool_probability != DEFAULT_UNKNOWN_TOOL_PROBABILITY:
            identity["unknown_tool_probability"] = self.unknown_tool_probability
        self.model_hash = _hash_of(identity)

    @property
    def active_requests(self) -> frozenset[str]:
        return frozenset(self._active)

    def _rng(self, request: GenerationRequest) -> random.Random:
        material = json.dumps(
            {
                "prompt": request.prompt,
                "messages": request.messages,
                "max_tokens": int(request.max_tokens),
                "temperature": float(request.temperature),
                "top_p": float(request.top_p),
                "top_k": int(request.top_k),
                "stop": list(request.stop),
                "seed": request.seed,
                "model": self._sampling_hash,
            },
            sort_keys=True,
            ensure_ascii=False,
        ).encode()
        return random.Random(hashlib.sha256(material).digest())

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        rid = request.request_id
        self._active.add(rid)
        finished = False
        try:
            drawn = self._json_tokens if request.json_schema is not None else self._vocab_tokens
            source = drawn(request)
            try:
                async for event in _through_stops(request, source):
                    finished = isinstance(event, Finish)
                    yield event
            finally:
                await source.aclose()
        finally:
            self._active.discard(rid)
            self._cancelled.discard(rid)
            self.cut_short += not finished

    async def _vocab_tokens(self, request: GenerationRequest) -> AsyncGenerator[Token | str, None]:
        """Tokens drawn from the vocabulary, paced at ``tokens_per_s``, then why they ended."""
        rid = request.request_id
        rng = self._rng(request)
        interval = 1.0 / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
        loop = asyncio.get_running_loop()
        start = loop.time()
        generated = 0
        while generated < request.max_tokens:
            if rid in self._cancelled:
                return
            if interval:
                delay = start + (generated + 1) * interval - loop.time()
                # behind schedule (the loop was busy), still yield: timers such as a
                # step's deadline must get their turn between paced tokens
                await asyncio.sleep(max(delay, 0))
                if rid in self._cancelled:
                    return
            elif generated % _FAST_YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if generated > 0 and rng.random() < self.eos_probability:
                yield "eos"
                return
            token_id = rng.randrange(len(VOCAB))
            generated += 1
            yield Token(text=VOCAB[token_id], token_id=token_id)
        yield "length"

    async def _json_tokens(self, request: GenerationRequest) -> AsyncGenerator[Token | str, None]:
        """JSON for the request's schema (``sim_json``) in token-sized pieces, then why they
        ended."""
        rid = request.request_id
        schema = json.dumps(request.json_schema, sort_keys=True).encode()
        # model_hash, unlike the plain seed, covers the JSON settings
        material = self._rng(request).getrandbits(256).to_bytes(32, "big") + schema
        seed = hashlib.sha256(material + self.model_hash.encode())
        sampler = SchemaSampler(
            random.Random(seed.digest()),
            error_p=self.schema_error_probability,
            unknown_p=self.unknown_tool_probability,
        )
        text = json.dumps(sampler.sample(request.json_schema), ensure_ascii=False)
        interval = 1.0 / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
        for n, piece in enumerate(json_pieces(text)):
            if n >= request.max_tokens:
                yield "length"
                return
            await asyncio.sleep(interval)
            if rid in self._cancelled:
                return
            yield Token(text=piece, token_id=None)
        yield "eos"

    def count_tokens(self, request: GenerationRequest) -> int | None:
        return sim_token_count(request.rendered_prompt())

    async def cancel(self, request_id: str) -> None:
        if request_id in self._active:
            self._cancelled.add(request_id)

    async def health(self) -> Health:
        return Health(live=True, ready=True)

    async def capabilities(self) -> Capabilities:
        return Capabilities(
            engine="sim",
            engine_version=SIM_VERSION,
            model=self.model,
            model_hash=self.model_hash,
            context_size=self.context_size,
            quantization=None,
            features=("seed", "stop", "token_ids", "json_schema"),
            extra={"tokens_per_s": self.tokens_per_s},
        )


class SimOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens_per_s: float | None = Field(
        default=None,
        ge=0,
        description="token rate; 0 streams as fast as possible; default: the service's sim setting",
    )
    eos_probability: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="chance of EOS per token; default: the service's sim setting",
    )
    context_size: int = Field(default=8192, description="context size the replica reports")
    schema_error_probability: float = Field(
        default=DEFAULT_SCHEMA_ERROR_PROBABILITY,
        description="chance that each JSON object breaks its schema (json_schema requests)",
    )
    unknown_tool_probability: float = Field(
        default=DEFAULT_UNKNOWN_TOOL_PROBABILITY,
        description='chance that each string const becomes "unknown_tool"',
    )


def _build(replica: ReplicaConfig, options: SimOptions, defaults: EngineDefaults) -> SimAdapter:
    return SimAdapter(
        tokens_per_s=(
            defaults.sim_tokens_per_s if options.tokens_per_s is None else options.tokens_per_s
        ),
        eos_probability=(
            defaults.sim_eos_probability
            if options.eos_probability is None
            else options.eos_probability
        ),
        model=replica.model or "sim-1",
        context_size=options.context_size,
        schema_error_probability=options.schema_error_probability,
        unknown_tool_probability=options.unknown_tool_probability,
    )


VARIANT = EngineVariant(adapter=SimAdapter, options=SimOptions, build=_build)
