"""What step kinds share at run time: tool executors, circuit breakers, the live hub.

Breaker state lives in this process (see ``orchestrator_core.breakers``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator_core.breakers import BreakerBoard
from orchestrator_core.secrets import Scrubber
from orchestratord.fs.guard import FsGuard
from orchestratord.gates.pool import CelPool
from orchestratord.metrics import Metrics
from orchestratord.pools.sessions import RunSessions
from orchestratord.settings import EngineLimitSettings
from orchestratord.steps.pacing import Pacing
from orchestratord.streams.hub import Hub
from orchestratord.tools.executors import ToolExecutors


@dataclass
class KindServices:
    tools: ToolExecutors
    tool_breakers: BreakerBoard
    engine_breakers: BreakerBoard
    hub: Hub  # waiting gates follow their run's events
    sessions: RunSessions  # engine sessions owned by runs (session-bound engines)
    fs: FsGuard  # where fs_op steps and Evergreen file references may reach
    poll_s: float = 0.5  # how often a waiting gate re-reads for other processes' facts
    metrics: Metrics = field(default_factory=Metrics)
    scrubber: Scrubber = field(default_factory=Scrubber)  # masks secrets in errors shown
    # what engine steps allow an engine: bytes per token and per output, idle and deadline
    engine_limits: EngineLimitSettings = field(default_factory=EngineLimitSettings)
    pacing: Pacing = field(default_factory=Pacing)  # runs whose reader holds their generation
    cel: CelPool = field(default_factory=CelPool)  # the processes evaluating gates

    async def aclose(self) -> None:
        await self.tools.aclose()
        await self.cel.aclose()
