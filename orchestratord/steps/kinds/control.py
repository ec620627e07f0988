"""What the kinds that run in the control plane share: their provenance and endings."""

from __future__ import annotations

from typing import Any, ClassVar

from contracts.events import EndEvent, ErrorEvent, FactEvent, Provenance, StartedEvent
from orchestrator_core import clock
from orchestrator_core.canonical import sha256_of
from orchestrator_core.generation import LlmInput
from orchestrator_core.lifecycle import StepStatus
from orchestrator_core.policy import PolicySubject
from orchestrator_core.replay import StepKey
from orchestratord.db.models import Fact, Run, Step
from orchestratord.facts.rows import fact_row
from orchestratord.steps.ending import Ending
from orchestratord.steps.kinds.base import StepContext
from orchestratord.steps.kinds.record import StepRecord

NO_PARAMS = sha256_of({})


def input_key(step_type: str, material: Any, seed: int) -> StepKey:
    """A control-plane step's determinism inputs: the hash of its normalized input."""
    return StepKey(
        type=step_type,
        prompt_hash=sha256_of(material),
        params_hash=NO_PARAMS,
        model=None,
        seed=seed,
    )


class ControlKind:
    """Defaults of a kind that runs in the control plane: no engine, no engine request,
    the policy subject is the step type, the determinism input is the stored input."""

    step_type: ClassVar[str]
    engine: ClassVar[bool] = False
    uses_flow: ClassVar[bool] = False
    rerunnable: ClassVar[bool] = False

    def subject(
        self, stored: dict[str, Any], *, model: str | None, pool: str | None
    ) -> PolicySubject:
        return PolicySubject(step_type=self.step_type)

    def llm_input(self, stored: dict[str, Any]) -> LlmInput | None:
        return None

    def model(self, stored: dict[str, Any]) -> str | None:
        return None

    def replay_key(self, stored: dict[str, Any], seed: int) -> StepKey:
        return input_key(self.step_type, stored, seed)

    def check_record(self, record: StepRecord) -> None:
        """Nothing of its own beyond what every step's record is checked for."""


def new_fact(ctx: StepContext, fact_type: str, data: Any) -> Fact:
    """A fact the step appends: its ``fact`` event now, its row with the step's end (put it
    in the ending's ``rows``)."""
    fact = fact_row(
        run_id=ctx.step.run_id, type=fact_type, data=data, emitted_by_step=ctx.step.step_id
    )
    ctx.emit(
        FactEvent(
            fact_id=fact.fact_id,
            fact_type=fact.type,
            data=fact.data,
            schema_uri=None,
            emitted_by_step=ctx.step.step_id,
        )
    )
    return fact


class ControlRun:
    """Provenance of one control-plane step, from ``started`` to its ending."""

    def __init__(self, ctx: StepContext, key: StepKey, engine: str, **extra: Any) -> None:
        self.ctx = ctx
        run: Run = ctx.run
        step: Step = ctx.step
        self.base: dict[str, Any] = {
            "seed": run.seed,
            "prompt_hash": key.prompt_hash,
            "params_hash": key.params_hash,
            "engine": engine,
            "engine_version": None,
            "model_hash": None,
            "pool_id": None,
            "replica_id": None,
            "policy_hash": run.policy_hash,
            "price_table": run.price_table,
            **extra,
        }
        self.started = clock.clock.monotonic()
        ctx.emit(StartedEvent(**self.base, replay_of=step.replay_of))

    def provenance(self) -> dict[str, Any]:
        elapsed_ms = round((clock.clock.monotonic() - self.started) * 1000, 3)
        return {
            **self.base,
            "tokens_in": 0,
            "tokens_out": 0,
            "cost_usd": 0.0,
            "decode_time_ms": elapsed_ms,
        }

    def succeeded(
        self,
        output: dict[str, Any],
        *,
        rows: list[Any] | None = None,
    ) -> Ending:
        final = self.provenance()
        return Ending(
            status=StepStatus.SUCCEEDED,
            event=EndEvent(
                stop_reason="eos", tokens_in=0, tokens_out=0, provenance=Provenance(**final)
            ),
            output={**output, "stop_reason": "eos"},
            provenance=final,
            rows=rows or [],
        )

    def failed(self, body: dict[str, Any], output: dict[str, Any]) -> Ending:
        final = self.provenance()
        full = {**body, "correlation_id": None, "provenance": final}
        return Ending(
            status=StepStatus.FAILED,
            event=ErrorEvent(**full),
            output={**output, "stop_reason": None},
            provenance=final,
            error=full,
        )

    def cancelled(self, output: dict[str, Any]) -> Ending:
        return Ending(
            status=StepStatus.CANCELLED,
            event=EndEvent(stop_reason="cancelled", tokens_in=0, tokens_out=0, provenance=None),
            output={**output, "stop_reason": "cancelled"},
            provenance=self.provenance(),
        )
