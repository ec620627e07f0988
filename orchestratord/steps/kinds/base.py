"""What a step kind is: the one protocol the pipeline calls, never asking which kind it holds.

A kind owns its typed input (``input_model``, from ``contracts.steps``), the normalized form
it stores, its determinism inputs (``replay_key``), its policy subject, what it reserves
(``llm_input``: an engine kind's prompt and ``max_tokens``; control-plane kinds reserve no
tokens), whether it needs an engine slot (``engine``), and how it runs (``execute``: a
coroutine that emits typed events through its context and returns how the step ended).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel

from contracts.events import EscalationEvent, EventBase
from orchestrator_core.breakers import Transition
from orchestrator_core.generation import LlmInput
from orchestrator_core.policy import PolicySubject
from orchestrator_core.pricing import Price
from orchestrator_core.replay import StepKey
from orchestratord.scrubbing import scrub_event
from orchestratord.steps.ending import Ending

if TYPE_CHECKING:
    from orchestratord.db.engine import Database
    from orchestratord.db.models import Flow, Run, Step
    from orchestratord.eventlog import StepLog
    from orchestratord.pools.registry import Pool, Replica
    from orchestratord.steps.kinds.record import StepRecord
    from orchestratord.steps.services import KindServices

escalation_log = logging.getLogger("orchestratord.escalations")


@dataclass
class StepContext:
    """What a running step may use. ``stop`` is set when it must stop (a cancel, or its
    budget deadline: then ``budget_stop`` is true)."""

    step: Step
    run: Run
    log: StepLog
    db: Database
    services: KindServices
    stop: asyncio.Event
    deadline_s: float | None
    price: Price | None = None
    pool: Pool | None = None
    replica: Replica | None = None
    budget_stop: bool = False

    def emit(self, event: EventBase) -> None:
        self.log.emit(scrub_event(event, self.services.scrubber))

    def emit_escalation(self, transition: Transition) -> None:
        """A breaker changed state during this step: an ``escalation`` event on its stream
        (and so on its run's), and a log line for operators."""
        body = self.services.scrubber.value(transition.as_event())  # its reason quotes errors
        escalation_log.warning(
            "circuit %s is %s",
            body["target"],
            body["state"],
            extra={"escalation": body, "step_id": self.step.step_id, "run_id": self.step.run_id},
        )
        self.log.emit(EscalationEvent(**body))


class StepKind(Protocol):
    """One step type. Registered once in ``kinds/__init__.py``."""

    step_type: ClassVar[str]
    input_model: ClassVar[type[BaseModel]]
    engine: ClassVar[bool]  # needs an engine slot: placed on a pool, admitted, priced
    uses_flow: ClassVar[bool]  # normalize reads the run's flow (its tools); else it gets None
    # may run again when the process running it was lost before it streamed anything: it
    # acts on nothing outside its own step (an engine generation, an expression), so a
    # second execution cannot repeat an effect
    rerunnable: ClassVar[bool]

    def normalize(self, parsed: Any, *, flow: Flow | None, field: str) -> dict[str, Any]:
        """The stored input: validated against the flow (a tool exists, args match its
        schema), normalized so equal inputs store and hash equal. Errors name ``field.*``."""
        ...

    def subject(
        self, stored: dict[str, Any], *, model: str | None, pool: str | None
    ) -> PolicySubject:
        """What policy rules match for this step."""
        ...

    def llm_input(self, stored: dict[str, Any]) -> LlmInput | None:
        """The engine request's prompt and params (engine kinds), else None."""
        ...

    def model(self, stored: dict[str, Any]) -> str | None:
        """The model the step asks for, or None (its pool's then; control-plane kinds ask
        for none)."""
        ...

    def replay_key(self, stored: dict[str, Any], seed: int) -> StepKey:
        """The determinism inputs replay compares with the recorded step's."""
        ...

    async def execute(self, ctx: StepContext) -> Ending:
        """Run the step: emit ``started`` and its body events, return how it ended."""
        ...

    def check_record(self, record: StepRecord) -> None:
        """An import's check of what this kind makes of its events (a plan's suggestions, a
        checkpoint's id): refuse with ``record.refuse`` naming the field that disagrees. What
        every step's record must agree with is checked before (``runs.transfer_checks``)."""
        ...
