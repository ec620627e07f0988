"""The deterministic simulated engine.

Tokens are a pure function of (prompt, sampling params, seed): a SHA-256 of the three seeds a
PRNG that picks words from a fixed vocabulary and decides where the sequence ends. It can run
at a given token rate or as fast as possible (``tokens_per_s=0``), for benchmarks.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
from collections.abc import AsyncIterator

from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)

SIM_VERSION = "1.0"
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


def sim_token_count(text: str) -> int:
    return len(_PIECE.findall(text))


class SimAdapter(WorkerAdapter):
    kind = "sim"

    def __init__(
        self,
        *,
        tokens_per_s: float = 50.0,
        eos_probability: float = 0.02,
        model: str = "sim-1",
        context_size: int = 8192,
    ) -> None:
        if tokens_per_s < 0:
            raise ValueError("tokens_per_s must be >= 0 (0 streams as fast as possible)")
        self.tokens_per_s = float(tokens_per_s)
        self.eos_probability = float(eos_probability)
        self.model = model
        self.context_size = context_size
        self._cancelled: set[str] = set()
        self._active: set[str] = set()
        identity = {
            "engine": "sim",
            "version": SIM_VERSION,
            "vocab": VOCAB,
            "eos_probability": self.eos_probability,
            "model": model,
        }
        self.model_hash = (
            "sha256:"
            + hashlib.sha256(
                json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest()
        )

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
                "model": self.model_hash,
            },
            sort_keys=True,
            ensure_ascii=False,
        ).encode()
        return random.Random(hashlib.sha256(material).digest())

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        rid = request.request_id
        self._active.add(rid)
        try:
            rng = self._rng(request)
            tokens_in = sim_token_count(request.rendered_prompt())
            interval = 1.0 / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
            loop = asyncio.get_running_loop()
            start = loop.time()
            stops = tuple(st for st in request.stop if st)
            emitted = ""  # text already yielded
            held: list[Token] = []  # tokens that may begin a stop string
            generated = 0
            sent = 0
            stop_reason = "length"
            while generated < request.max_tokens:
                if rid in self._cancelled:
                    return
                if interval:
                    delay = start + (generated + 1) * interval - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if rid in self._cancelled:
                        return
                elif generated % _FAST_YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                if generated > 0 and rng.random() < self.eos_probability:
                    stop_reason = "eos"
                    break
                token_id = rng.randrange(len(VOCAB))
                generated += 1
                if not stops:
                    sent += 1
                    yield Token(text=VOCAB[token_id], token_id=token_id)
                    continue
                held.append(Token(text=VOCAB[token_id], token_id=token_id))
                pending = "".join(t.text for t in held)
                hit = _first_stop(emitted + pending, stops, len(emitted))
                if hit is not None:
                    for tok in _cut(held, hit - len(emitted)):
                        sent += 1
                        yield tok
                    held = []
                    stop_reason = "stop"
                    break
                safe = _safe_length(emitted + pending, stops) - len(emitted)
                while held and len(held[0].text) <= safe:
                    tok = held.pop(0)
                    safe -= len(tok.text)
                    emitted += tok.text
                    sent += 1
                    yield tok
            for tok in held:
                sent += 1
                yield tok
            yield Finish(stop_reason=stop_reason, tokens_in=tokens_in, tokens_out=sent)
        finally:
            self._active.discard(rid)
            self._cancelled.discard(rid)

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
            features=("seed", "stop", "token_ids"),
            extra={"tokens_per_s": self.tokens_per_s},
        )


def _cut(held: list[Token], upto: int) -> list[Token]:
    """The held tokens truncated to their first ``upto`` characters (empty pieces dropped)."""
    out = []
    for tok in held:
        if upto <= 0:
            break
        piece = tok.text[:upto]
        out.append(Token(text=piece, token_id=tok.token_id))
        upto -= len(tok.text)
    return out


def _safe_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the prefix of ``text`` that no stop string can still begin in."""
    safe = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                safe = min(safe, len(text) - k)
                break
    return safe


def _first_stop(text: str, stops: tuple[str, ...], searched_upto: int) -> int | None:
    """Index in ``text`` where the earliest stop string begins, at or after ``searched_upto``.

    Text before ``searched_upto`` has been sent, and by construction no stop begins in it.
    """
    best: int | None = None
    for stop in stops:
        idx = text.find(stop, searched_upto)
        if idx != -1 and (best is None or idx < best):
            best = idx
    return best
