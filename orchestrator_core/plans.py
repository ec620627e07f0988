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
    """The answer: ``{"calls": [...]}``, each call one of the tools with its own args schema.

    A tool whose parameters use local refs (``#/$defs/x``) is put under the plan's ``$defs``
    by name, with its refs pointing there: embedded as they are, "#" would mean the plan.
    (A path through ``anyOf/<i>`` would do for JSON Schema, but llama.cpp's grammar
    converter resolves refs through objects only.)
    """
    branches = []
    defs: dict[str, Any] = {}
    for tool in sorted(tools, key=lambda t: t["name"]):
        args = tool["parameters"]
        rebased = _rebase_refs(args, f"#/$defs/{tool['name']}")
        if rebased != args:
            defs[tool["name"]] = rebased
            args = {"$ref": f"#/$defs/{tool['name']}"}
        branches.append(
            {
                "type": "object",
                "properties": {"tool": {"const": tool["name"]}, "args": args},
                "required": ["tool", "args"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "calls": {
                "type": "array",
                "items": {"anyOf": branches},
                "minItems": 0,
                "maxItems": MAX_CALLS,
            }
        },
        "required": ["calls"],
        "additionalProperties": False,
    }
    if defs:
        schema["$defs"] = defs
    return schema


# Keywords whose values are data, not subschemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose keys are names (a property named "const" is a schema, not data).
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def _rebase_refs(schema: Any, base: str) -> Any:
    """``schema`` with its local refs (``#/$defs/x``) pointing into the plan schema at ``base``.

    A schema with its own ``$id`` is a resource of its own, where "#" already means itself,
    so it is kept as it is.
    """
    if isinstance(schema, dict) and "$id" in schema:
        return schema
    return _rebased(schema, base)


def _rebased(node: Any, base: str) -> Any:
    if isinstance(node, list):
        return [_rebased(item, base) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("$ref", "$dynamicRef") and isinstance(value, str) and value.startswith("#/"):
            out[key] = base + value[1:]
        elif key == "$ref" and value == "#":
            out[key] = base
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _rebased(sub, base) for name, sub in value.items()}
        else:
            out[key] = _rebased(value, base)
    return out


def loose_plan_schema(tool_names: list[str]) -> dict[str, Any]:
    """The same shape with free-form args: for a grammar converter that rejects a schema."""
    return {
        "type": "object",
        "properties": {
            "calls": {
                "type": "array",
                "minItems": 0,
                "maxItems": MAX_CALLS,
                "items": {
                    "type": "object",
                    "properties": {
                        "tool": {"enum": sorted(tool_names)},
                        "args": {"type": "object"},
                    },
                    "required": ["tool", "args"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["calls"],
        "additionalProperties": False,
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
    """The whole text as JSON, else the first JSON object in it (prose, code fences).

    An object with ``calls`` wins over one before it without: a model may echo an example
    argument object before its answer.
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    found: list[Any] = []
    start = text.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict) and "calls" in value:
            return value
        found.append(value)
        start = text.find("{", end)
    if found:
        return found[0]
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
