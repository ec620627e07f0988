"""An engine that lies about nothing but one token: for proving strict_replay's reports.

``PerturbedAdapter`` wraps a real adapter and reports the same identity (engine, version,
model hash), so a strict replay accepts it, but changes its output at one token index: the
token is replaced by another (``mode="replace"``), or the stream ends there
(``mode="truncate"``). It also counts the requests it saw, which shows whether a replay
touched an engine at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)


class PerturbedAdapter(WorkerAdapter):
    kind = "perturbed"

    def __init__(
        self,
        inner: WorkerAdapter,
        *,
        at: int | None = None,
        mode: Literal["replace", "truncate"] = "replace",
        text: str = "PERTURBED ",
    ) -> None:
        self.inner = inner
        self.at = at
        self.mode = mode
        self.text = text
        self.requests: list[GenerationRequest] = []

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        self.requests.append(request)
        index = 0
        async for item in self.inner.stream(request):
            if isinstance(item, Token):
                if index == self.at:
                    if self.mode == "truncate":
                        yield Finish(stop_reason="eos", tokens_in=0, tokens_out=index)
                        return
                    token_id = None if item.token_id is None else item.token_id + 1
                    item = Token(text=self.text, token_id=token_id, logprob=item.logprob)
                index += 1
            yield item

    async def cancel(self, request_id: str) -> None:
        await self.inner.cancel(request_id)

    async def health(self) -> Health:
        return await self.inner.health()

    async def capabilities(self) -> Capabilities:
        return await self.inner.capabilities()

    def count_tokens(self, request: GenerationRequest) -> int | None:
        return self.inner.count_tokens(request)

    async def start(self) -> None:
        await self.inner.start()

    async def aclose(self) -> None:
        await self.inner.aclose()
