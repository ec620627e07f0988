"""``gate_eval``: a CEL expression over the run's facts (``orchestrator_core.gates``).

The expression is compiled at submission (422 ``GATE_EXPR_INVALID`` with line and column,
or ``reason: "cost"`` when it may build far more than it reads). Running, it is evaluated
over the run's latest facts in a process of its own (``orchestratord/gates/``), bounded in
the bytes it reads and builds, in memory and in time (``ORCHESTRATORD_CEL__*``). With
``wait_ms`` a false gate waits: it evaluates again when a fact is appended to its run or
one of its steps settles, in this process or another (``gates/watch.py``), never on the
tokens of its run's other steps; it ends ``false`` when the wait runs out. A waiting gate
holds a control-plane slot, never an engine slot. The boolean is the output and a
``gate_result`` fact ``{expr, result}``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from contracts.steps import GateEvalInput
from orchestrator_core import clock
from orchestrator_core.gates import Gate, GateExprInvalid, check_cost, compile_gate
from orchestratord.db.models import Flow
from orchestratord.gates.facts import read_fingerprint
from orchestratord.gates.watch import FactWatch
from orchestratord.steps.ending import Ending
from orchestratord.steps.kinds.base import StepContext
from orchestratord.steps.kinds.control import ControlKind, ControlRun, new_fact


class GateEval(ControlKind):
    step_type: ClassVar[str] = "gate_eval"
    input_model: ClassVar[type[BaseModel]] = GateEvalInput
    rerunnable: ClassVar[bool] = True  # reads facts; its own fact is written with its end

    def normalize(self, parsed: Any, *, flow: Flow | None, field: str) -> dict[str, Any]:
        assert isinstance(parsed, GateEvalInput)
        compile_gate(parsed.expr, field=f"{field}.expr")
        stored: dict[str, Any] = {"expr": parsed.expr}
        if parsed.wait_ms is not None:
            stored["wait_ms"] = parsed.wait_ms
        return stored

    async def execute(self, ctx: StepContext) -> Ending:
        step = ctx.step
        control = ControlRun(ctx, self.replay_key(step.input, ctx.run.seed), "gate:cel")
        gate = compile_gate(step.input["expr"])
        services = ctx.services
        wait_s = step.input.get("wait_ms", 0) / 1000
        ends_at = clock.clock.monotonic() + wait_s
        channel = services.hub.subscribe_run(step.run_id) if wait_s > 0 else None
        try:
            watch = FactWatch(channel, ctx.db, step.run_id, services.poll_s) if channel else None
            while True:
                try:
                    fingerprint = await read_fingerprint(ctx.db, step.run_id)
                    result, cost_s = await self._evaluate(ctx, gate, fingerprint)
                except GateExprInvalid as exc:
                    return control.failed(exc.body(), {"result": None})
                if result or watch is None or clock.clock.monotonic() >= ends_at:
                    break
                watch.evaluated(fingerprint, cost_s)
                if await watch.changed(ctx.stop, ends_at):
                    continue
                if ctx.stop.is_set() and not ctx.budget_stop:
                    return control.cancelled({"result": None})
                break  # the wait ran out, or the run's budget stopped it: false
        finally:
            if channel is not None:
                services.hub.unsubscribe_run(step.run_id)
        fact = new_fact(ctx, "gate_result", {"expr": gate.expr, "result": result})
        return control.succeeded({"result": result}, rows=[fact])

    async def _evaluate(self, ctx: StepContext, gate: Gate, fingerprint: Any) -> tuple[bool, float]:
        """The gate's value, and how long reading its variables took."""
        pool = ctx.services.cel
        limits = pool.settings
        variables = await pool.reads.variables(
            ctx.db, ctx.run.run_id, fingerprint, max_input_bytes=limits.max_input_bytes
        )
        check_cost(gate, variables.input_bytes, limits.max_value_bytes)
        return await pool.evaluate(gate, variables.request(gate.expr)), variables.read_s
