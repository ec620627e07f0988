"""The plan template, its schema, and parsing answers into suggestions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from orchestrator_core.generation import normalize_llm_input
from orchestrator_core.plans import (
    PLAN_TEMPLATE_VERSION,
    loose_plan_schema,
    parse_plan,
    plan_prompt,
    plan_schema,
)
from orchestrator_core.tools import arg_errors

ADD: dict[str, Any] = {
    "name": "add",
    "description": "add two integers",
    "parameters": {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
ECHO = {"name": "echo", "description": "", "parameters": {"type": "object"}}


def validate(schema: dict[str, Any], args: Any) -> list[dict[str, Any]]:
    return [e.as_dict() for e in arg_errors(schema, args)]


def test_the_prompt_lists_tools_by_name_whatever_their_order() -> None:
    a, _ = plan_prompt(prompt="Do it.", messages=None, tools=[ADD, ECHO])
    b, _ = plan_prompt(prompt="Do it.", messages=None, tools=[ECHO, ADD])
    assert a == b
    assert a is not None
    assert a.index("- add:") < a.index("- echo")
    assert a.endswith("Task: Do it.")
    assert '{"properties":{"a":{"type":"integer"},"b":' in a  # canonical JSON of the schema
    assert PLAN_TEMPLATE_VERSION == "plan-v1"
    shuffled = {**ADD, "parameters": dict(reversed(list(ADD["parameters"].items())))}
    c, _ = plan_prompt(prompt="Do it.", messages=None, tools=[ECHO, shuffled])
    hashes = {
        normalize_llm_input(prompt=p, messages=None, params=None, model=None).prompt_hash
        for p in (a, b, c)
    }
    assert len(hashes) == 1


def test_messages_get_the_menu_as_a_system_message() -> None:
    _, msgs = plan_prompt(prompt=None, messages=[{"role": "user", "content": "hi"}], tools=[ADD])
    assert msgs is not None
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "- add: add two integers" in msgs[0]["content"]
    _, merged = plan_prompt(
        prompt=None,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        tools=[ADD],
    )
    assert merged is not None and len(merged) == 2
    assert merged[0]["content"].endswith("be brief")
    assert merged[0]["content"].startswith(msgs[0]["content"])
    _, again = plan_prompt(prompt=None, messages=[{"role": "user", "content": "hi"}], tools=[ADD])
    assert again == msgs


def test_schemas_are_valid_and_accept_a_plan() -> None:
    for schema in (plan_schema([ECHO, ADD]), loose_plan_schema(["add", "echo"])):
        Draft202012Validator.check_schema(schema)
        v = Draft202012Validator(schema)
        assert v.is_valid({"calls": [{"tool": "add", "args": {"a": 1, "b": 2}}]})
        assert not v.is_valid({"calls": [{"tool": "nope", "args": {}}]})
    strict = Draft202012Validator(plan_schema([ADD]))
    assert not strict.is_valid({"calls": [{"tool": "add", "args": {"a": 1}}]})


def test_the_schema_bounds_the_number_of_calls() -> None:
    calls = plan_schema([ADD])["properties"]["calls"]
    assert (calls["minItems"], calls["maxItems"]) == (0, 8)
    v = Draft202012Validator(plan_schema([ADD]))
    assert v.is_valid({"calls": []})
    assert not v.is_valid({"calls": [{"tool": "add", "args": {"a": 1, "b": 2}}] * 9})
    assert not v.is_valid({"calls": [], "extra": 1})


def test_loose_schema_takes_any_args_of_a_known_tool() -> None:
    v = Draft202012Validator(loose_plan_schema(["echo", "add"]))
    assert v.is_valid({"calls": [{"tool": "add", "args": {"anything": [1]}}]})
    assert not v.is_valid({"calls": [{"tool": "add", "args": 3}]})


TREE = {
    "name": "tree",
    "description": "a tree of numbers",
    "parameters": {
        "$defs": {"n": {"type": "integer", "minimum": 1}},
        "type": "object",
        "properties": {
            "n": {"$ref": "#/$defs/n"},
            "kids": {"type": "array", "items": {"$ref": "#"}},
            "const": {"const": {"$ref": "#/$defs/n"}},
        },
        "required": ["n"],
    },
}


def test_a_tools_refs_still_resolve_inside_the_plan() -> None:
    schema = plan_schema([ADD, TREE])
    Draft202012Validator.check_schema(schema)
    v = Draft202012Validator(schema)
    good = {"tool": "tree", "args": {"n": 1, "kids": [{"n": 2}]}}
    assert v.is_valid({"calls": [good]})
    assert not v.is_valid({"calls": [{"tool": "tree", "args": {"n": 1, "kids": [{"n": 0}]}}]})
    rebased = schema["$defs"]["tree"]
    # a property named like a keyword is a schema; a const's value is data, left alone
    assert rebased["properties"]["const"] == {"const": {"$ref": "#/$defs/n"}}
    assert rebased["properties"]["n"] == {"$ref": "#/$defs/tree/$defs/n"}
    # tools without refs are embedded as they are
    assert (
        schema["properties"]["calls"]["items"]["anyOf"][0]["properties"]["args"]
        == (ADD["parameters"])
    )


def plan(calls: Any) -> str:
    return json.dumps({"calls": calls})


def test_parse_reports_valid_invalid_and_unknown_in_order() -> None:
    text = plan(
        [
            {"tool": "add", "args": {"a": 1, "b": 2}},
            {"tool": "add", "args": {"a": "x"}},
            {"tool": "rm", "args": {}},
            {"tool": "echo", "args": [1]},
            "nonsense",
        ]
    )
    got = [s.as_dict() for s in parse_plan(text, [ADD, ECHO], validate=validate)]
    assert [(s["tool"], s["valid"]) for s in got] == [
        ("add", True),
        ("add", False),
        ("rm", False),
        ("echo", False),
        (None, False),
    ]
    assert [e["pointer"] for e in got[1]["errors"]] == ["/a", "/b"]
    assert got[2]["errors"][0]["pointer"] == "/tool"
    assert "add, echo" in got[2]["errors"][0]["message"]
    assert got[3]["errors"][0]["pointer"] == "/args"


def test_a_tool_not_offered_is_unknown() -> None:
    (s,) = parse_plan(plan([{"tool": "echo", "args": {}}]), [ADD], validate=validate)
    assert not s.valid


@pytest.mark.parametrize(
    "text",
    [
        'Sure! ```json\n{"calls": [{"tool": "echo", "args": {}}]}\n``` done',
        'x {"calls": [{"tool": "echo", "args": {}}]}',
    ],
)
def test_prose_and_fences_around_the_json(text: str) -> None:
    (s,) = parse_plan(text, [ECHO], validate=validate)
    assert s.valid and s.tool == "echo"


def test_a_plan_after_an_echoed_object_wins() -> None:
    text = 'Args look like {"a": 1}. Answer: {"calls": [{"tool": "echo", "args": {}}]}'
    (s,) = parse_plan(text, [ECHO], validate=validate)
    assert s.valid and s.tool == "echo"


def test_a_plan_cut_short_is_no_plan() -> None:
    text = '{"calls": [{"tool": "echo", "args": {}}, {"tool": "ec'
    (s,) = parse_plan(text, [ECHO], validate=validate)
    assert not s.valid and s.errors[0]["pointer"] == "/calls"


def test_an_empty_plan_has_no_suggestions() -> None:
    assert parse_plan('{"calls": []}', [ECHO], validate=validate) == []


def test_a_call_without_a_tool_name() -> None:
    (s,) = parse_plan(plan([{"args": {"text": "x"}}]), [ECHO], validate=validate)
    assert (s.tool, s.args, s.valid) == (None, {"text": "x"}, False)
    assert s.errors[0]["pointer"] == "/tool"


@pytest.mark.parametrize(
    ("text", "pointer"),
    [("not json at all", ""), ('{"calls": 3}', "/calls"), ("[1, 2]", "/calls")],
)
def test_answers_that_are_no_plan_are_one_invalid_suggestion(text: str, pointer: str) -> None:
    (s,) = parse_plan(text, [ECHO], validate=validate)
    assert s.tool is None and not s.valid
    assert s.errors[0]["pointer"] == pointer
