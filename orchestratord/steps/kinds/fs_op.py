"""``fs_op``: read, write, list, stat or delete a file beneath the run's ``fs_policy`` roots.

The name rules are ``orchestrator_core.fs`` and the I/O is ``orchestratord.fs.broker`` (no
path leaves its root, links are never followed, writes are atomic), run in the broker's threads.
A refusal ends the step with ``FS_POLICY_VIOLATION`` and ``details.reason``; an allowed
operation that cannot be done (a missing file, not UTF-8 text) with ``FS_ERROR``. Repeated
violations in a run open its breaker (``fs:<run_id>``): further file steps of the run fail
fast with ``CIRCUIT_OPEN``. Policy rules may match ``path``. Replay serves the recorded
result without touching the disk.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from contracts.steps import FsOpInput
from orchestrator_core.errors import CircuitOpen, OrchestratorError
from orchestrator_core.fs import FsPolicyViolation, FsRules
from orchestrator_core.policy import PolicySubject
from orchestratord.db.models import Flow
from orchestratord.fs import broker
from orchestratord.steps.ending import Ending
from orchestratord.steps.kinds.base import StepContext
from orchestratord.steps.kinds.control import ControlKind, ControlRun


class FsError(OrchestratorError):
    code = "FS_ERROR"


class FsOp(ControlKind):
    step_type: ClassVar[str] = "fs_op"
    input_model: ClassVar[type[BaseModel]] = FsOpInput

    def normalize(self, parsed: Any, *, flow: Flow | None, field: str) -> dict[str, Any]:
        stored: dict[str, Any] = parsed.model_dump(mode="json", exclude_none=True)
        return stored

    def subject(
        self, stored: dict[str, Any], *, model: str | None, pool: str | None
    ) -> PolicySubject:
        return PolicySubject(step_type=self.step_type, path=stored["path"])

    async def execute(self, ctx: StepContext) -> Ending:
        step, run = ctx.step, ctx.run
        inp = step.input
        control = ControlRun(ctx, self.replay_key(inp, run.seed), "fs", target=inp["op"])
        breaker = ctx.services.tool_breakers.get(f"fs:{run.run_id}")
        try:
            permit = breaker.before_call()
        except CircuitOpen as exc:
            return control.failed(exc.body(), {})
        if permit.transition is not None:
            ctx.emit_escalation(permit.transition)
        rules = FsRules.from_policy(run.fs_policy)
        try:
            result = await broker.off_loop(
                broker.run_op, ctx.services.fs, rules, inp["op"], inp["path"], inp.get("content")
            )
        except FsPolicyViolation as exc:
            transition = permit.failure(exc.reason)
            if transition is not None:
                ctx.emit_escalation(transition)
            return control.failed(exc.body(), {})
        except broker.FsFailure as exc:
            permit.success()
            body = FsError(exc.message, details={"reason": exc.reason, "path": inp["path"]})
            return control.failed(body.body(), {})
        except OSError as exc:
            permit.success()
            body = FsError(
                f"{exc.strerror or exc}", details={"reason": "os_error", "path": inp["path"]}
            )
            return control.failed(body.body(), {})
        permit.success()
        return control.succeeded(result)
