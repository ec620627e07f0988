"""``llm_plan``: an ``llm_call`` whose prompt carries a menu of the flow's tools and whose
answer is a plan of tool calls.

The menu and the answer's JSON Schema come from ``orchestrator_core.plans`` (the template
is versioned; the rendered prompt and the schema are what ``prompt_hash`` and
``params_hash`` cover). Engines constrain their output to the schema (llama.cpp's grammar,
``response_format`` on OpenAI-compatible servers, the sim engine's generator); the answer is
parsed either way. Each suggested call is checked against its tool's schema and the run's
policy, and streamed as a ``tool_suggest`` event before ``end``: invalid or unknown ones are
reported, never dropped.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from contracts.events import ToolSuggestEvent
from contracts.steps import LlmPlanInput
from orchestrator_core.generation import LlmInput, normalize_llm_input
from orchestrator_core.plans import PLAN_TEMPLATE_VERSION, parse_plan, plan_prompt, plan_schema
from orchestrator_core.policy import PolicySubject
from orchestrator_core.tools import arg_errors
from orchestratord.db.models import Flow
from orchestratord.policies import policy_of
from orchestratord.steps.kinds.base import StepContext
from orchestratord.steps.kinds.llm_call import LlmCall
from orchestratord.steps.kinds.record import StepRecord
from orchestratord.steps.kinds.tool_call import find_tool, unknown_tool


def _validate(schema: dict[str, Any], args: Any) -> list[dict[str, Any]]:
    return [e.as_dict() for e in arg_errors(schema, args)]


class LlmPlan(LlmCall):
    step_type: ClassVar[str] = "llm_plan"
    input_model: ClassVar[type[BaseModel]] = LlmPlanInput
    engine: ClassVar[bool] = True
    uses_flow: ClassVar[bool] = True
    rerunnable: ClassVar[bool] = True

    def normalize(self, parsed: Any, *, flow: Flow | None, field: str) -> dict[str, Any]:
        assert isinstance(parsed, LlmPlanInput) and flow is not None
        specs = []
        for i, name in enumerate(parsed.tools):
            tool = find_tool(flow, name)
            if tool is None:
                raise unknown_tool(flow, name, f"{field}.tools[{i}]")
            specs.append(
                {
                    "name": tool["name"],
                    "description": tool.get("description", ""),
                    "parameters": tool["parameters"],
                }
            )
        stored = super().normalize(parsed, flow=flow, field=field)
        stored["tools"] = sorted({s["name"] for s in specs})
        # The menu as offered: a step keeps what it was planned against.
        stored["tool_specs"] = sorted(
            {s["name"]: s for s in specs}.values(), key=lambda s: s["name"]
        )
        stored["template"] = PLAN_TEMPLATE_VERSION
        return stored

    def llm_input(self, stored: dict[str, Any]) -> LlmInput:
        specs = stored["tool_specs"]
        prompt, messages = plan_prompt(
            prompt=stored.get("prompt"), messages=stored.get("messages"), tools=specs
        )
        params = {**(stored.get("params") or {}), "json_schema": plan_schema(specs)}
        return normalize_llm_input(
            prompt=prompt, messages=messages, params=params, model=stored.get("model")
        )

    def check_record(self, record: StepRecord) -> None:
        """Its ``output.suggestions`` are its ``tool_suggest`` events, in order."""
        output = record.output
        if not isinstance(output, dict) or "suggestions" not in output:
            return
        suggestions = [
            {k: ev.data.get(k) for k in ("tool", "args", "valid", "errors")}
            for ev in record.of_type("tool_suggest")
        ]
        if output["suggestions"] != suggestions:
            record.refuse(
                f"are not the step's {len(suggestions)} tool_suggest events",
                field=f"{record.path}.output.suggestions",
            )

    def after_stream(
        self, ctx: StepContext, stored: dict[str, Any], text: str, stop_reason: str
    ) -> dict[str, Any]:
        specs = stored["tool_specs"]
        policy = policy_of(ctx.run)
        suggestions = []
        for suggestion in parse_plan(text, specs, validate=_validate):
            body = suggestion.as_dict()
            if body["tool"] is not None:
                decision = policy.evaluate(PolicySubject(step_type="tool_call", tool=body["tool"]))
                if not decision.allowed:
                    body["valid"] = False
                    body["errors"] = [
                        *body["errors"],
                        {
                            "pointer": "/tool",
                            "message": f"denied by policy rule {decision.rule_id}",
                        },
                    ]
            ctx.emit(ToolSuggestEvent(**body))
            suggestions.append(body)
        return {"suggestions": suggestions}
