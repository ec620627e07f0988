"""The rules a declared JSON Schema passes (orchestrator_core.schemas.rules), each alone: a
fixture declares the schema, the outcome is data (passed, or the error's code and field)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.errors import OrchestratorError
from orchestrator_core.flows import FlowLimits, normalize_flow
from orchestrator_core.schemas.rules import (
    MAX_CHAIN,
    RULES,
    BoundedExpansion,
    BoundedUniqueItems,
    Declared,
    LocalReferences,
    MetaSchema,
    NoEndlessReference,
    NoRepeatedRecursion,
    Regexes,
    SchemaLimits,
    SchemaRule,
    Size,
    check_schema,
)

FIELD = "tools[0].parameters"


def outcome(rule: SchemaRule, schema: Any, limits: SchemaLimits | None = None) -> dict[str, Any]:
    """The rule's outcome as data."""
    try:
        rule.check(Declared(schema, FIELD, limits or SchemaLimits()))
    except OrchestratorError as exc:
        return {"code": exc.code, "field": exc.details.get("field") or exc.field}  # type: ignore[attr-defined]
    return {"passed": True}


def refused(field: str, code: str = "INVALID_PARAMS") -> dict[str, Any]:
    return {"code": code, "field": field}


PASSED = {"passed": True}


def doubling(depth: int) -> dict[str, Any]:
    """The issue's schema: ``a_i = allOf[$ref a_{i+1}, $ref a_{i+1}]``, under 1 KB."""
    defs: dict[str, Any] = {
        f"a{i}": {"allOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"$ref": f"#/$defs/a{i + 1}"}]}
        for i in range(depth)
    }
    defs[f"a{depth}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


def chain(length: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(length)}
    defs[f"a{length}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
    "$ref": "#/$defs/node",
}
JSON_VALUE = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"$ref": "#"}},
        {"type": "object", "additionalProperties": {"$ref": "#"}},
    ]
}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string", "pattern": "^(a+)+$"}, PASSED),  # RE2 runs it in linear time
        ({"type": "string", "pattern": r"^caf\u00e9$"}, PASSED),
        ({"properties": {"x": {"pattern": "^(?=a)"}}}, refused(f"{FIELD}.properties.x.pattern")),
        ({"patternProperties": {r"(a)\1": {}}}, refused(rf"{FIELD}.patternProperties.(a)\1")),
        ({"$defs": {"old": {"pattern": "(?<=x)"}}}, refused(f"{FIELD}.$defs.old.pattern")),
        ({"items": {"pattern": r"\p{L}{1,30}"}}, refused(f"{FIELD}.items.pattern")),
    ],
)
def test_regexes(schema: Any, expected: dict[str, Any]) -> None:
    assert outcome(Regexes(), schema) == expected


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"}, PASSED),
        ({"$id": "https://x.test/s", "$defs": {"a": {"$anchor": "A"}}, "$ref": "#A"}, PASSED),
        ({"properties": {"x": True}, "$ref": "#/properties/x"}, PASSED),
        ({"$ref": "http://169.254.169.254/latest"}, refused(f"{FIELD}.$ref")),
        ({"$ref": "https://json-schema.org/draft/2020-12/schema"}, refused(f"{FIELD}.$ref")),
        ({"items": {"$ref": "#/nowhere"}}, refused(f"{FIELD}.items.$ref")),
        ({"$defs": {"a": {"type": "x"}}, "$ref": "#/$defs/a/type"}, refused(f"{FIELD}.$ref")),
        ({"$dynamicRef": "#nope"}, refused(f"{FIELD}.$dynamicRef")),
    ],
)
def test_local_references(schema: Any, expected: dict[str, Any]) -> None:
    assert outcome(LocalReferences(), schema) == expected


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (TREE, PASSED),
        ({"$ref": "#"}, refused(FIELD)),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
          "$ref": "#/$defs/a"}, refused(f"{FIELD}.$defs.a")),
    ],
)  # fmt: skip
def test_no_endless_reference(schema: Any, expected: dict[str, Any]) -> None:
    assert outcome(NoEndlessReference(), schema) == expected


@pytest.mark.parametrize(
    ("schema", "limits", "expected"),
    [
        (doubling(10), SchemaLimits(), PASSED),  # 4,094 subschemas
        # a_i expands to 2**(depth + 2 - i) - 3 subschemas: the deepest past the bound is named
        (doubling(16), SchemaLimits(), refused(f"{FIELD}.$defs.a4")),  # 16,381
        (doubling(10), SchemaLimits(max_nodes=1_000), refused(f"{FIELD}.$defs.a2")),  # 1,021
        (TREE, SchemaLimits(max_nodes=100), PASSED),  # recursion is counted once
        (chain(MAX_CHAIN - 2), SchemaLimits(), PASSED),
        (chain(MAX_CHAIN), SchemaLimits(), refused(FIELD)),
    ],
)
def test_bounded_expansion(schema: Any, limits: SchemaLimits, expected: dict[str, Any]) -> None:
    assert outcome(BoundedExpansion(), schema, limits) == expected


def test_the_expansion_refusal_names_its_setting() -> None:
    with pytest.raises(OrchestratorError) as info:
        check_schema(doubling(16), field=FIELD)
    assert info.value.details["limit"] == "validation.max_schema_nodes"
    assert info.value.details["value"] == 10_000


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (TREE, PASSED),
        (JSON_VALUE, PASSED),  # items and properties never meet one value
        (
            {"$defs": {"t": {"properties": {"a": {"$ref": "#/$defs/t"},
                                            "b": {"$ref": "#/$defs/t"}}}},
             "$ref": "#/$defs/t"},
            PASSED,  # a binary tree: each child once
        ),
        (
            {"$defs": {"t": {"properties": {"c": {"allOf": [{"$ref": "#/$defs/t"},
                                                            {"$ref": "#/$defs/t"}]}}}},
             "$ref": "#/$defs/t"},
            refused(f"{FIELD}.$defs.t.properties.c"),
        ),
        (
            {"oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}],
             "$defs": {"A": {"properties": {"children": {"items": {"$ref": "#"}}}},
                       "B": {"properties": {"children": {"items": {"$ref": "#"}}}}}},
            refused(FIELD),  # both branches take children back to the root
        ),
    ],
)  # fmt: skip
def test_no_repeated_recursion(schema: Any, expected: dict[str, Any]) -> None:
    assert outcome(NoRepeatedRecursion(), schema) == expected


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, PASSED),
        ({"items": {"type": ["integer", "null"]}, "uniqueItems": True}, PASSED),
        ({"items": {"enum": [1, "a", None]}, "uniqueItems": True}, PASSED),
        ({"prefixItems": [{}, {}], "items": False, "uniqueItems": True}, PASSED),
        ({"items": {"type": "object"}, "uniqueItems": True, "maxItems": 1000}, PASSED),
        ({"uniqueItems": False}, PASSED),
        ({"items": {"type": "object"}, "uniqueItems": True}, refused(f"{FIELD}.uniqueItems")),
        ({"uniqueItems": True, "maxItems": 1001}, refused(f"{FIELD}.uniqueItems")),
        ({"items": {"enum": [[1]]}, "uniqueItems": True}, refused(f"{FIELD}.uniqueItems")),
        (
            {"properties": {"xs": {"items": {"$ref": "#/$defs/o"}, "uniqueItems": True}},
             "$defs": {"o": {"type": "string"}}},
            refused(f"{FIELD}.properties.xs.uniqueItems"),  # what a $ref holds is not read
        ),
    ],
)  # fmt: skip
def test_bounded_unique_items(schema: Any, expected: dict[str, Any]) -> None:
    assert outcome(BoundedUniqueItems(), schema) == expected


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "object"}, PASSED),
        ({"type": 5}, refused(FIELD)),
        ({"pattern": 5}, refused(FIELD)),
    ],
)
def test_meta_schema(schema: Any, expected: dict[str, Any]) -> None:
    assert outcome(MetaSchema(), schema) == expected


def test_size() -> None:
    big = {"description": "x" * 200}
    assert outcome(Size(), big) == PASSED
    refusal = outcome(Size(), big, SchemaLimits(max_bytes=100))
    assert refusal == refused(FIELD, code="LIMIT_EXCEEDED")


def test_the_rules_run_in_their_order() -> None:
    assert [type(r).__name__ for r in RULES] == [
        "Size",
        "MetaSchema",
        "LocalReferences",
        "Regexes",
        "NoEndlessReference",
        "BoundedExpansion",
        "NoRepeatedRecursion",
        "BoundedUniqueItems",
    ]


def _flow(tools: list[dict[str, Any]], config: dict[str, Any], limits: FlowLimits) -> None:
    normalize_flow(ast={"op": "seq"}, tools=tools, config=config, limits=limits)


def test_a_flow_names_the_tool_field() -> None:
    tool = {"name": "t", "parameters": {"properties": {"x": {"pattern": "(?=a)"}}}}
    with pytest.raises(OrchestratorError) as info:
        _flow([tool], {}, FlowLimits())
    assert info.value.details["errors"][0]["field"] == "tools[0].parameters.properties.x.pattern"


def test_fact_schemas_pass_the_same_rules_and_size() -> None:
    limits = FlowLimits(max_tool_schema_bytes=200)
    with pytest.raises(OrchestratorError) as info:
        _flow([], {"fact_schemas": {"T": {"pattern": "(a)\\1"}}}, limits)
    assert info.value.details["errors"][0]["field"] == "config.fact_schemas.T.pattern"
    with pytest.raises(OrchestratorError) as info:
        _flow([], {"fact_schemas": {"T": {"description": "x" * 300}}}, limits)
    assert info.value.details["field"] == "config.fact_schemas.T"
    assert info.value.details["limit"] == "limits.max_tool_schema_bytes"
    with pytest.raises(OrchestratorError) as info:
        _flow([], {"fact_schemas": {"T": {"items": {}, "uniqueItems": True}}}, limits)
    assert info.value.details["errors"][0]["field"] == "config.fact_schemas.T.uniqueItems"
