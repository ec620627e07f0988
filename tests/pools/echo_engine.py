"""An engine added the way CONTRIBUTING.md says: this module, and one line in ``ENGINES``
(``tests/pools/test_engine_variants.py`` adds it). It answers with the prompt's words, each
``repeat`` times."""

from __future__ import annotations

from collections.abc import AsyncIterator

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


class EchoAdapter(WorkerAdapter):
    kind = "echo"

    def __init__(self, *, model: str, repeat: int) -> None:
        self.model = model
        self.repeat = repeat

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        words = request.rendered_prompt().split()
        sent = 0
        for word in words:
            for _ in range(self.repeat):
                if sent == request.max_tokens:
                    yield Finish(stop_reason="length", tokens_in=len(words), tokens_out=sent)
                    return
                sent += 1
                yield Token(text=word + " ")
        yield Finish(stop_reason="eos", tokens_in=len(words), tokens_out=sent)

    async def cancel(self, request_id: str) -> None:
        return None

    async def health(self) -> Health:
        return Health(live=True, ready=True)

    async def capabilities(self) -> Capabilities:
        return Capabilities(
            engine="echo",
            engine_version="1",
            model=self.model,
            model_hash="sha256:" + "e" * 64,
            context_size=1024,
            # its words are the prompt's alone: a seed gives the same tokens again (a seeded
            # run's sampling steps go only to engines saying so, docs/placement.md "Seeds")
            features=("seed",),
        )


class EchoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repeat: int = Field(default=1, ge=1, le=8, description="times each prompt word is said")


def _build(replica: ReplicaConfig, options: EchoOptions, defaults: EngineDefaults) -> EchoAdapter:
    return EchoAdapter(model=replica.model or "echo-1", repeat=options.repeat)


VARIANT = EngineVariant(adapter=EchoAdapter, options=EchoOptions, build=_build)
