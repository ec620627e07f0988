"""How a step ended, as data: what its runner commits with the terminal event."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts.events import EndEvent, ErrorEvent
from orchestrator_core.lifecycle import StepStatus


@dataclass
class Ending:
    """How a step ended: its terminal event and what its row keeps."""

    status: StepStatus
    event: EndEvent | ErrorEvent
    output: dict[str, Any]
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = 0.0  # None: the model had no price (not known)
    provenance: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    replay_outcome: str | None = None
    rows: list[Any] = field(default_factory=list)  # rows the step adds: facts, checkpoints
