"""Tool args against JSON Schema 2020-12: every error, each with its RFC 6901 pointer."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.errors import ToolArgsInvalid
from orchestrator_core.schemas import validator as validator_module
from orchestrator_core.tools import ArgError, arg_errors, check_args
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
        (None, [""]),
        ({"a": "x", "b": 1}, ["/a"]),
        ({"a": 1}, ["/b"]),
        ({}, ["/a", "/b"]),
        ({"a": 1, "b": -1}, ["/b"]),
        ({"a": 1, "b": 1, "c": 1, "d": 2}, ["/c", "/d"]),
        (
            {"a": 1, "b": 1, "items": [{"name": "ok"}, {}, {"name": 3}]},
            ["/items/1/name", "/items/2/name"],
        ),
        ({"a": 1, "b": 1, "items": {}}, ["/items"]),
        ({"a": 1, "b": 1, "x/y~z": 5}, ["/x~1y~0z"]),
        ({"a": "x", "c": 1}, ["/a", "/b", "/c"]),
    ],
    ids=[
        "valid",
        "root-type",
        "root-null",
        "nested-type",
        "required",
        "required-all",
        "minimum",
        "additional",
        "array-items",
        "array-type",
        "escaped",
        "several",
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


@pytest.mark.parametrize(
    ("schema", "args", "expected"),
    [
        (
            {"type": "object", "required": ["a/b", "~"]},
            {},
            [("/a~1b", "is required"), ("/~0", "is required")],
        ),
        (
            {"type": "object", "properties": {"o": {"type": "object", "required": ["k"]}}},
            {"o": {}},
            [("/o/k", "is required")],
        ),
        (
            {"type": "object", "dependentRequired": {"a": ["b", "c"]}},
            {"a": 1, "c": 1},
            [("/b", "is required when 'a' is given")],
        ),
        (
            {
                "type": "object",
                "patternProperties": {"^x_": {}},
                "additionalProperties": False,
            },
            {"x_1": 1, "y": 2, "z/": 3},
            [("/y", "is not allowed"), ("/z~1", "is not allowed")],
        ),
        (
            {
                "type": "object",
                "properties": {"a": {}},
                "allOf": [{"properties": {"b": {}}}],
                "unevaluatedProperties": False,
            },
            {"a": 1, "b": 2, "c)": 3, "it's": 4},
            [("/c)", "is not allowed"), ("/it's", "is not allowed")],
        ),
        (
            {"type": "object", "unevaluatedProperties": {"type": "string"}},
            {"x": 1, "y": "ok"},
            [("/x", "is not valid under unevaluatedProperties")],
        ),
        (
            {"type": "object", "additionalProperties": {"type": "string"}},
            {"x": 1},
            [("/x", "1 is not of type 'string'")],
        ),
    ],
    ids=[
        "required-escaped",
        "required-nested",
        "dependent-required",
        "pattern-properties",
        "unevaluated-false",
        "unevaluated-schema",
        "additional-schema",
    ],
)
def test_property_errors_point_at_the_property(
    schema: dict[str, Any], args: Any, expected: list[tuple[str, str]]
) -> None:
    assert [(e.pointer, e.message) for e in arg_errors(schema, args)] == expected


@pytest.mark.parametrize("keyword", ["anyOf", "oneOf"])
def test_a_failed_alternative_is_one_error_at_the_value(keyword: str) -> None:
    schema = {
        "type": "object",
        "properties": {"v": {keyword: [{"type": "string"}, {"type": "integer"}]}},
    }
    (error,) = arg_errors(schema, {"v": [1]})
    assert error.pointer == "/v"
    assert error.message.startswith("[1] is not valid under")


def test_errors_are_sorted_and_not_repeated() -> None:
    schema = {"allOf": [{"type": "string"}, {"type": "string"}], "required": ["z", "a"]}
    errors = arg_errors(schema, {})
    assert errors == sorted(errors)
    assert [e.pointer for e in errors] == ["", "/a", "/z"]


def test_long_values_are_cut() -> None:
    schema = {"type": "object", "properties": {"s": {"enum": ["a", "b"]}}}
    (error,) = arg_errors(schema, {"s": "y" * 5000})
    assert error.message == "'" + "y" * 76 + "... is not one of ['a', 'b']"


def test_long_schema_values_are_cut() -> None:
    schema = {"enum": [str(i) * 20 for i in range(100)]}
    (error,) = arg_errors(schema, "q")
    assert len(error.message) == 200
    assert error.message.startswith("'q' is not one of [")
    assert error.message.endswith("...")


def test_check_args_lists_every_error() -> None:
    with pytest.raises(ToolArgsInvalid) as info:
        check_args("add", SCHEMA, {"a": "x"})
    body = info.value.body()
    assert body["code"] == "TOOL_ARGS_INVALID"
    assert body["retriable"] is False
    assert body["details"] == {
        "tool": "add",
        "field": "input.args",
        "errors": [
            {"pointer": "/a", "message": "'x' is not of type 'integer'"},
            {"pointer": "/b", "message": "is required"},
        ],
    }
    assert "and 1 more" in body["message"]


def test_check_args_accepts_valid_args() -> None:
    check_args("add", SCHEMA, {"a": 1, "b": 2})


def test_arg_error_as_dict() -> None:
    assert ArgError("/a", "is required").as_dict() == {"pointer": "/a", "message": "is required"}


def test_validators_are_compiled_once_per_schema() -> None:
    same = {"type": "object", "properties": {"q": {"type": "string"}}}
    reordered = {"properties": {"q": {"type": "string"}}, "type": "object"}
    assert validator_for(same) is validator_for(dict(same)) is validator_for(reordered)
    assert validator_for(same) is not validator_for({"type": "object"})


def test_a_cached_validator_ignores_later_changes_to_the_callers_schema() -> None:
    schema: dict[str, Any] = {"type": "object", "required": ["cached_only"]}
    validator = validator_for(schema)
    schema["required"] = []
    assert not validator.is_valid({})
    assert arg_errors(schema, {}) == []


def test_schemas_differing_only_in_unicode_form_do_not_share_a_validator() -> None:
    nfc = {"type": "object", "required": ["\u00e9"]}
    nfd = {"type": "object", "required": ["e\u0301"]}
    assert validator_for(nfc) is not validator_for(nfd)
    assert arg_errors(nfd, {"e\u0301": 1}) == []


def test_integers_beyond_64_bits_are_kept_exactly() -> None:
    schema = {"const": 2**70}
    assert arg_errors(schema, 2**70) == []
    assert [e.pointer for e in arg_errors(schema, 2**70 + 1)] == [""]


def test_the_cache_is_bounded() -> None:
    for n in range(validator_module.CACHE_SIZE + 10):
        validator_for({"maxLength": n})
    assert validator_module.compiled.cache_info().currsize == validator_module.CACHE_SIZE


@pytest.mark.parametrize(
    ("path", "pointer"),
    [([], ""), (["a"], "/a"), (["a/b", 0, "~"], "/a~1b/0/~0"), (["~1"], "/~01"), ([""], "/")],
)
def test_pointer_escaping(path: list[Any], pointer: str) -> None:
    assert pointer_of(path) == pointer


def test_an_error_at_the_root_is_named_as_such() -> None:
    with pytest.raises(ToolArgsInvalid) as info:
        check_args("add", SCHEMA, [])
    assert info.value.message.endswith("its schema: (root): [] is not of type 'object'")
    assert info.value.details["errors"] == [
        {"pointer": "", "message": "[] is not of type 'object'"}
    ]
