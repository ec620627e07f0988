"""A scripted fake adapter for tests: plays back a list of events, delays and failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)


@dataclass(frozen=True)
class Delay:
    seconds: float


ScriptItem = Token | Finish | Delay | BaseException


class ScriptedAdapter(WorkerAdapter):
    kind = "scripted"

    def __init__(self, script: Sequence[ScriptItem], *, ready: bool = True) -> None:
        self.script = list(script)
        self.ready = ready
        self.requests: list[GenerationRequest] = []
        self.cancelled: list[str] = []
        self.closed_streams = 0

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        self.requests.append(request)
        try:
            for item in self.script:
                if request.request_id in self.cancelled:
                    return
                if isinstance(item, Delay):
                    await asyncio.sleep(item.seconds)
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            self.closed_streams += 1

    async def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    async def health(self) -> Health:
        return Health(live=True, ready=self.ready)

    async def capabilities(self) -> Capabilities:
        return Capabilities(
            engine="scripted",
            engine_version="1",
            model="scripted",
            model_hash="sha256:" + "0" * 64,
            context_size=1024,
        )
