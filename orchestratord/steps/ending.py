"""How a step ended, as data: what its runner commits with the terminal event.

``StepEnd`` is the one definition of what a step's end writes to its row: one field per
column, named as the column. Its ``status`` is written through the lifecycle's writer
(``transition.step_values``: ``ended_at`` stamped, the lease released), and every statement
that ends a running step is built from these fields (``steps/ends.py``: one step, several in
one statement, several in the event log's statement appending their terminal events). A
column added to a step's end is a field added here (with a default, so runners that do not
know it need no change), and the runner that sets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts.events import EndEvent, ErrorEvent
from orchestrator_core.lifecycle import StepStatus


@dataclass(frozen=True, slots=True)
class StepEnd:
    """The columns of a step's row its end sets (each field a column of ``steps``)."""

    status: StepStatus
    output: dict[str, Any] | None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = 0.0  # None: the model had no price (not known)
    provenance: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    replay_outcome: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ending(StepEnd):
    """How a step ended: what its row keeps (``StepEnd``), its terminal event, and the rows
    it adds."""

    event: EndEvent | ErrorEvent
    rows: list[Any] = field(default_factory=list)  # rows the step adds: facts, checkpoints
