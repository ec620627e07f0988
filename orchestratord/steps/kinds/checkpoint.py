"""``checkpoint``: the interpreter's state stored with the server's cursors.

The cursors say where the run stood when the state was taken: the last fact appended, the
position of this step (every step before it was submitted), and the budget usage. A
``checkpoint`` event precedes ``end``; the output is ``{checkpoint_id, state_hash}``. A
replay serves the recorded output (the checkpoint of the record) when the state hashes equal.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from contracts.events import CheckpointEvent
from contracts.steps import CheckpointInput
from orchestrator_core import clock
from orchestrator_core.canonical import normalize, sha256_of
from orchestrator_core.replay import StepKey
from orchestratord.db.models import Checkpoint, Flow
from orchestratord.facts.service import cursors_in
from orchestratord.runs.service import get_run
from orchestratord.steps.ending import Ending
from orchestratord.steps.kinds.base import StepContext
from orchestratord.steps.kinds.control import ControlKind, ControlRun, input_key
from orchestratord.steps.kinds.record import StepRecord


class CheckpointStep(ControlKind):
    step_type: ClassVar[str] = "checkpoint"
    input_model: ClassVar[type[BaseModel]] = CheckpointInput
    rerunnable: ClassVar[bool] = True  # its row is written with its end, in one transaction

    def normalize(self, parsed: Any, *, flow: Flow | None, field: str) -> dict[str, Any]:
        assert isinstance(parsed, CheckpointInput)
        return {"state": normalize(parsed.state, f"{field}.state")}

    def replay_key(self, stored: dict[str, Any], seed: int) -> StepKey:
        return input_key(self.step_type, stored["state"], seed)

    def check_record(self, record: StepRecord) -> None:
        """Its output names the checkpoint its ``checkpoint`` event announced."""
        output = record.output
        if not isinstance(output, dict) or "checkpoint_id" not in output:
            return
        for ev in record.of_type("checkpoint"):
            if ev.data["checkpoint_id"] not in record.checkpoints:
                continue  # a replay step's served event: the checkpoint is the recorded run's
            for key in ("checkpoint_id", "state_hash"):
                if output.get(key) != ev.data[key]:
                    record.refuse(
                        f"differs from the step's checkpoint event (seq {ev.seq})",
                        field=f"{record.path}.output.{key}",
                        ev=ev,
                    )

    async def execute(self, ctx: StepContext) -> Ending:
        step = ctx.step
        control = ControlRun(ctx, self.replay_key(step.input, ctx.run.seed), "checkpoint")
        state = step.input["state"]
        async with ctx.db.read() as session:
            run = await get_run(session, run_id=step.run_id)  # fresh usage, not the claim's
            cursors = await cursors_in(session, run, position=step.position)
        row = Checkpoint(
            checkpoint_id=clock.new_id("ckpt"),
            run_id=step.run_id,
            step_id=step.step_id,
            state=state,
            state_hash=sha256_of(state),
            cursors=cursors,
            created_at=clock.now(),
        )
        ctx.emit(
            CheckpointEvent(
                checkpoint_id=row.checkpoint_id, state_hash=row.state_hash, cursors=cursors
            )
        )
        return control.succeeded(
            {"checkpoint_id": row.checkpoint_id, "state_hash": row.state_hash}, rows=[row]
        )
