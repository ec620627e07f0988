"""``tool_call``: one call of a flow's tool, run in the control plane.

The args are checked against the tool's JSON Schema 2020-12 at submission (422
``TOOL_ARGS_INVALID`` listing every error with its JSON pointer). The call goes through the
tool's executor (``http``: a POST of the args; ``builtin``: a function in this process),
behind a circuit breaker per endpoint, bounded by the tool's timeout and the step's wall
budget. Its JSON result is the step's output and a ``tool_result`` fact. Redact rules of
the run's policy mask the args (before the call: a secret never leaves) and the result.
Replay runs serve the recorded result; the tool is not called again.
"""

from __future__ import annotations

import asyncio
import contextlib
import unicodedata
from collections import OrderedDict
from typing import Any, ClassVar

from pydantic import BaseModel

from contracts.events import (
    NarrationEvent,
)
from contracts.steps import ToolCallInput
from orchestrator_core.errors import CircuitOpen, InvalidParams, ToolError
from orchestrator_core.policy import PolicySubject, redact_json
from orchestrator_core.replay import StepKey
from orchestrator_core.tools import check_args
from orchestratord.db.engine import Database
from orchestratord.db.models import Flow
from orchestratord.policies import policy_of
from orchestratord.steps.ending import Ending
from orchestratord.steps.kinds.base import StepContext
from orchestratord.steps.kinds.control import ControlKind, ControlRun, input_key, new_fact
from orchestratord.steps.kinds.record import StepRecord
from orchestratord.tools.errors import ToolFailure
from orchestratord.tools.executors import ToolInvocation


def find_tool(flow: Flow, name: str) -> dict[str, Any] | None:
    wanted = unicodedata.normalize("NFC", name)
    for tool in flow.tools:
        if tool["name"] == wanted:
            return tool
    return None


def unknown_tool(flow: Flow, name: str, field: str) -> InvalidParams:
    names = ", ".join(t["name"] for t in flow.tools) or "none"
    return InvalidParams(
        f"the flow has no tool {name!r} (its tools: {names})",
        field=field,
        details={"tools": [t["name"] for t in flow.tools]},
    )


class _FlowTools:
    """Tools by flow id. Flows are content-addressed and immutable, so what was read once
    stays true; a small LRU keeps the executor's lookup off the database."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._flows: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()

    async def get(self, db: Database, flow_id: str, name: str) -> dict[str, Any] | None:
        tools = self._flows.get(flow_id)
        if tools is None:
            async with db.read() as session:
                flow = await session.get(Flow, flow_id)
            tools = {t["name"]: t for t in (flow.tools if flow is not None else [])}
            self._flows[flow_id] = tools
            if len(self._flows) > self._size:
                self._flows.popitem(last=False)
        else:
            self._flows.move_to_end(flow_id)
        return tools.get(name)


_FLOW_TOOLS = _FlowTools()


class ToolCall(ControlKind):
    step_type: ClassVar[str] = "tool_call"
    input_model: ClassVar[type[BaseModel]] = ToolCallInput
    uses_flow: ClassVar[bool] = True

    def normalize(self, parsed: Any, *, flow: Flow | None, field: str) -> dict[str, Any]:
        assert isinstance(parsed, ToolCallInput) and flow is not None
        tool = find_tool(flow, parsed.tool)
        if tool is None:
            raise unknown_tool(flow, parsed.tool, f"{field}.tool")
        check_args(tool["name"], tool["parameters"], parsed.args)
        return {"tool": tool["name"], "args": parsed.args}

    def subject(
        self, stored: dict[str, Any], *, model: str | None, pool: str | None
    ) -> PolicySubject:
        return PolicySubject(step_type=self.step_type, tool=stored["tool"])

    def check_record(self, record: StepRecord) -> None:
        """Its output's ``result`` is the result in its ``tool_result`` fact."""
        output = record.output
        if not isinstance(output, dict) or "result" not in output:
            return
        for ev in record.of_type("fact"):
            data = ev.data["data"]
            if (
                ev.data["fact_type"] == "tool_result"
                and isinstance(data, dict)
                and data.get("result") != output["result"]
            ):
                record.refuse(
                    "is not the result in the step's tool_result fact event",
                    field=f"{record.path}.output.result",
                    ev=ev,
                )

    def replay_key(self, stored: dict[str, Any], seed: int) -> StepKey:
        return input_key(self.step_type, {"tool": stored["tool"], "args": stored["args"]}, seed)

    async def execute(self, ctx: StepContext) -> Ending:
        step, run = ctx.step, ctx.run
        name, args = step.input["tool"], step.input["args"]
        tool = await _FLOW_TOOLS.get(ctx.db, run.flow_id, name)
        if tool is None:  # the flow's tools are fixed by its hash: only a broken row gets here
            raise RuntimeError(f"tool {name!r} of step {step.step_id} is not in its flow")
        executors = ctx.services.tools
        invocation = ToolInvocation(
            tool=name,
            args=args,
            executor=tool["executor"],
            deadline_s=ctx.deadline_s,
            request_id=step.step_id,
        )
        target = executors.target_of(invocation)
        control = ControlRun(
            ctx,
            self.replay_key(step.input, run.seed),
            f"tool:{tool['executor']['kind']}",
            tool=name,
            target=target,
        )
        empty = {"result": None}
        breaker = ctx.services.tool_breakers.get(target)
        try:
            permit = breaker.before_call()
        except CircuitOpen as exc:
            return control.failed(exc.body(), empty)
        if permit.transition is not None:
            ctx.emit_escalation(permit.transition)

        def on_retry(attempt: int, reason: str) -> None:
            ctx.emit(NarrationEvent(text=f"retrying tool {name} (attempt {attempt + 1}): {reason}"))

        call = asyncio.create_task(executors.call(invocation, on_retry=on_retry))
        stop = asyncio.create_task(ctx.stop.wait())
        try:
            await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not call.done():
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, ToolFailure):
                await call
            permit.release()  # stopped before an answer: nothing learnt about the target
            if ctx.budget_stop:
                body = ToolError(
                    f"tool {name} did not answer within the step's wall budget",
                    details={"tool": name, "target": target, "reason": "budget"},
                ).body()
                return control.failed(body, empty)
            return control.cancelled(empty)
        try:
            result = call.result()
        except ToolFailure as failure:
            counts = failure.status is None or failure.status >= 500 or failure.status == 429
            transition = permit.failure(failure.reason) if counts else permit.success()
            if transition is not None:
                ctx.emit_escalation(transition)
            body = ToolError(
                f"tool {name} failed: {failure.message}",
                details={"tool": name, "target": target, **failure.details()},
                retriable=failure.retriable,
            ).body()
            return control.failed(body, empty)
        transition = permit.success()
        if transition is not None:
            ctx.emit_escalation(transition)
        decision = policy_of(run).evaluate(self.subject(step.input, model=None, pool=None))
        if decision.patterns:
            result = redact_json(result, decision.patterns)
        fact = new_fact(ctx, "tool_result", {"tool": name, "args": args, "result": result})
        return control.succeeded({"result": result}, rows=[fact])
