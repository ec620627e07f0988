"""Tool args against JSON Schema 2020-12: every error, each with its RFC 6901 pointer."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.errors import ToolArgsInvalid
from orchestrator_core.tools import arg_errors, check_args
from orchestrator_core.tools.args import pointer_of, validator_for

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "integer", "minimum": 0},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
        "x/y~z": {"type": "string"},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("args", "pointers"),
    [
        ({"a": 1, "b": 2}, []),
        ([], [""]),
        ({"a": "x", "b": 1}, ["/a"]),
        ({"a": 1}, ["/b"]),
        ({}, ["/a", "/b"]),
        ({"a": 1, "b": -1}, ["/b"]),
        ({"a": 1, "b": 1, "c": 1, "d": 2}, ["/c", "/d"]),
        (
            {"a": 1, "b": 1, "items": [{"name": "ok"}, {}, {"name": 3}]},
            ["/items/1/name", "/items/2/name"],
        ),
        ({"a": 1, "b": 1, "x/y~z": 5}, ["/x~1y~0z"]),
        ({"a": "x", "c": 1}, ["/a", "/b", "/c"]),
    ],
)
def test_every_error_with_its_pointer(args: Any, pointers: list[str]) -> None:
    assert [e.pointer for e in arg_errors(SCHEMA, args)] == pointers


def test_messages_say_what_is_wrong() -> None:
    errors = {e.pointer: e.message for e in arg_errors(SCHEMA, {"a": "x", "c": 1})}
    assert errors == {
        "/a": "'x' is not of type 'integer'",
        "/b": "is required",
        "/c": "is not allowed",
    }


def test_long_values_are_not_dumped_whole() -> None:
    schema = {"type": "object", "properties": {"s": {"enum": ["a", "b"]}}}
    (error,) = arg_errors(schema, {"s": "y" * 5000})
    assert len(error.message) < 300


def test_check_args_lists_every_error() -> None:
    with pytest.raises(ToolArgsInvalid) as info:
        check_args("add", SCHEMA, {"a": "x"})
    body = info.value.body()
    assert body["code"] == "TOOL_ARGS_INVALID"
    assert body["details"]["tool"] == "add"
    assert body["details"]["errors"] == [
        {"pointer": "/a", "message": "'x' is not of type 'integer'"},
        {"pointer": "/b", "message": "is required"},
    ]
    assert "and 1 more" in body["message"]


def test_validators_are_compiled_once_per_schema() -> None:
    same = {"type": "object", "properties": {"q": {"type": "string"}}}
    assert validator_for(same) is validator_for(dict(same))


def test_pointer_escaping() -> None:
    assert pointer_of([]) == ""
    assert pointer_of(["a/b", 0, "~"]) == "/a~1b/0/~0"
