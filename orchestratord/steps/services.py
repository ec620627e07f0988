"""What step kinds share at run time: tool executors and circuit breakers.

Breaker state lives in this process (see ``orchestrator_core.breakers``)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator_core.breakers import BreakerBoard

from orchestratord.tools.executors import ToolExecutors


@dataclass
class KindServices:
    tools: ToolExecutors
    tool_breakers: BreakerBoard
    engine_breakers: BreakerBoard

    async def aclose(self) -> None:
        await self.tools.aclose()
