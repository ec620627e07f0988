"""Plans: the tool menu an ``llm_plan`` step puts in its prompt, the JSON Schema of the
answer, and the parsing of the answer into suggestions.

The template (``PLAN_TEMPLATE_VERSION = "plan-v1"``), for a prompt::

    You can call these tools. Answer with JSON only:
    {"calls": [{"tool": "<name>", "args": {...}}]}

    Tools:
    - <name>: <description>
      parameters: <the tool's JSON Schema, canonical JSON>
    ...

    Task: <the step's prompt>

For messages, everything above "Task:" is a system message put first (merged into a
leading system message when there is one). Tools are listed by name, and schemas as
canonical JSON, so the rendered prompt, and its hash, do not depend on the order the flow
or the step gave them in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator_core.canonical import canonical_json

PLAN_TEMPLATE_VERSION = "plan-v1"
MAX_CALLS = 8
_HEADER = (
    "You can call these tools. Answer with JSON only:\n"
    '{"calls": [{"tool": "<name>", "args": {...}}]}\n\n'
    "Tools:\n"
)

Validate = Callable[[dict[str, Any], Any], list[dict[str, Any]]]


def menu(tools: list[dict[str, Any]]) -> str:
    lines = []
    for tool in sorted(tools, key=lambda t: t["name"]):
        lines.append(f"- {tool['name']}: {tool.get('description') or ''}".rstrip())
        lines.append(f"  parameters: {canonical_json(tool['parameters']).decode()}")
    return _HEADER + "\n".join(lines)


def plan_prompt(
    *, prompt: str | None, messages: list[dict[str, Any]] | None, tools: list[dict[str, Any]]
) -> tuple[str | None, list[dict[str, Any]] | None]:
    """The step's prompt (or messages) with the tool menu: (prompt, None) or (None, messages)."""
    head = menu(tools)
    if messages is None:
        return f"{head}\n\nTask: {prompt or ''}", None
    rest = [{"role": m["role"], "content": m["content"]} for m in messages]
    if rest and rest[0]["role"] == "system":
        first = {"role": "system", "content": f"{head}\n\n{rest[0]['content']}"}
        return None, [first, *rest[1:]]
    return None, [{"role": "system", "content": head}, *rest]


def plan_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer: ``{"calls": [...]}``, each call one of the tools with its own args schema."""
    branches = [
        {
            "type": "object",
            "properties": {"tool": {"const": t["name"]}, "args": t["parameters"]},
            "required": ["tool", "args"],
            "additionalProperties": False,
        }
        for t in sorted(tools, key=lambda t: t["name"])
    ]
    return {
        "type": "object",
        "properties": {
            "calls": {"type": "array", "items": {"anyOf": branches}, "maxItems": MAX_CALLS}
        },
        "required": ["calls"],
        "additionalProperties": False,
    }


def loose_plan_schema(tool_names: list[str]) -> dict[str, Any]:
    """The same shape with free-form args: for a grammar converter that rejects a schema."""
    return {
        "type": "object",
        "properties": {
            "calls": {
                "type": "array",
                "maxItems": MAX_CALLS,
                "items": {
                    "type": "object",
                    "properties": {
                        "tool": {"enum": sorted(tool_names)},
                        "args": {"type": "object"},
                    },
                    "required": ["tool", "args"],
                },
            }
        },
        "required": ["calls"],
    }


@dataclass(frozen=True)
class Suggestion:
    tool: str | None
    args: Any
    valid: bool
    errors: tuple[dict[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "args": self.args,
            "valid": self.valid,
            "errors": list(self.errors),
        }


def _first_object(text: str) -> Any:
    """The whole text as JSON, else the first JSON object in it (prose, code fences)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
            return value
        except ValueError:
            start = text.find("{", start + 1)
    raise ValueError("no JSON object in the text")


def _invalid(pointer: str, message: str, tool: str | None = None, args: Any = None) -> Suggestion:
    return Suggestion(tool, args, False, ({"pointer": pointer, "message": message},))


def parse_plan(text: str, tools: list[dict[str, Any]], *, validate: Validate) -> list[Suggestion]:
    """Every call of the answer as a suggestion, in order; invalid ones are kept and say why."""
    try:
        plan = _first_object(text)
    except ValueError as exc:
        return [_invalid("", f"the plan is not JSON: {exc}")]
    calls = plan.get("calls") if isinstance(plan, dict) else None
    if not isinstance(calls, list):
        return [_invalid("/calls", "the plan has no list of calls")]
    by_name = {t["name"]: t for t in tools}
    offered = ", ".join(sorted(by_name)) or "none"
    out = []
    for i, call in enumerate(calls):
        at = f"/calls/{i}"
        if not isinstance(call, dict):
            out.append(_invalid(at, "a call must be an object {tool, args}"))
            continue
        name, args = call.get("tool"), call.get("args")
        if not isinstance(name, str):
            out.append(_invalid("/tool", "a call must name its tool", None, args))
        elif name not in by_name:
            out.append(
                _invalid("/tool", f"unknown tool {name!r}; the plan may use: {offered}", name, args)
            )
        elif not isinstance(args, dict):
            out.append(_invalid("/args", "args must be an object", name, args))
        else:
            errors = validate(by_name[name]["parameters"], args)
            out.append(Suggestion(name, args, not errors, tuple(errors)))
    return out
