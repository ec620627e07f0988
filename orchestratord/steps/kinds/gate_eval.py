"""``gate_eval``: a CEL expression over the run's facts (``orchestrator_core.gates``).

The expression is compiled at submission (422 ``GATE_EXPR_INVALID`` with line and column).
Running, it is evaluated over the run's facts, bounded by the CEL runtime's cost limit
(``orchestrator_core.gates``). With ``wait_ms`` a false gate waits: it is woken by
each event of its run in this process (a new fact wakes it at once) and, for facts appended
by other processes, re-reads every ``ORCHESTRATORD_STREAM__POLL_S``; it ends ``false`` when
the wait runs out. A waiting gate holds a control-plane slot, never an engine slot. The
boolean is the output and a ``gate_result`` fact ``{expr, result}``.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import sqlalchemy as sa
from pydantic import BaseModel

from contracts.steps import GateEvalInput
from orchestrator_core import clock
from orchestrator_core.gates import MAX_FACTS, Gate, GateExprInvalid, compile_gate
from orchestratord.db.engine import Database
from orchestratord.db.models import Fact, Flow, Run
from orchestratord.runs.ledger import usage_of
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
            while True:
                cursor = channel.last + 1 if channel is not None else 0
                try:
                    result = await self._evaluate(ctx, gate)
                except GateExprInvalid as exc:
                    return control.failed(exc.body(), {"result": None})
                left = ends_at - clock.clock.monotonic()
                if result or channel is None or left <= 0:
                    break
                stop = asyncio.ensure_future(ctx.stop.wait())
                woke = asyncio.ensure_future(channel.wait(cursor, min(left, services.poll_s)))
                try:
                    await asyncio.wait({stop, woke}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    woke.cancel()
                if ctx.stop.is_set():
                    if ctx.budget_stop:
                        result = False
                        break
                    return control.cancelled({"result": None})
        finally:
            if channel is not None:
                services.hub.unsubscribe_run(step.run_id)
        fact = new_fact(ctx, "gate_result", {"expr": gate.expr, "result": result})
        return control.succeeded({"result": result}, rows=[fact])

    async def _evaluate(self, ctx: StepContext, gate: Gate) -> bool:
        facts, run = await _activation(ctx.db, ctx.run.run_id)
        return gate.evaluate(facts, run)


async def _activation(db: Database, run_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``facts`` (the latest ``MAX_FACTS``, in append order) and ``run`` as CEL sees them."""
    async with db.read() as session:
        rows = (
            await session.execute(
                sa.select(Fact.type, Fact.data, Fact.emitted_by_step, Fact.created_at)
                .where(Fact.run_id == run_id)
                .order_by(Fact.id.desc())
                .limit(MAX_FACTS)
            )
        ).all()
        run = (await session.execute(sa.select(Run).where(Run.run_id == run_id))).scalar_one()
        facts = [
            {"type": t, "data": d, "step_id": s, "ts": c.isoformat()}
            for t, d, s, c in reversed(rows)
        ]
        view = {
            "run_id": run.run_id,
            "usage": usage_of(run),
            "budgets": run.budgets,
        }
    return facts, view
