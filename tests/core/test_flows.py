"""Content addressing of flows (orchestrator_core.flows)."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest

from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import InvalidParams
from orchestrator_core.flows import FlowContent, flow_id_for, normalize_flow

PINNED_HASH = "sha256:eb78ff5962ec4ef4d5f66cc79003f1c5293625e7032fbca9b117f394836bef94"


_OBJECT = object()


def tool(name: str, parameters: Any = _OBJECT, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": extra.pop("description", ""),
        "parameters": {"type": "object"} if parameters is _OBJECT else parameters,
        "executor": extra.pop("executor", {"kind": "builtin", "name": "echo"}),
        **extra,
    }


def flow(
    ast: Any = None, tools: list[dict[str, Any]] | None = None, config: dict[str, Any] | None = None
) -> FlowContent:
    return normalize_flow(
        ast={"op": "seq"} if ast is None else ast,
        tools=[] if tools is None else tools,
        config={} if config is None else config,
    )


def _field_of(exc: InvalidParams) -> str:
    assert exc.code == "INVALID_PARAMS"
    [error] = exc.details["errors"]
    assert error["field"] == exc.field
    return exc.field


# --- identity ----------------------------------------------------------------------------------


def test_pinned_flow_hash() -> None:
    content = normalize_flow(
        ast={"op": "seq", "body": [1, 2.0]},
        tools=[tool("b"), tool("a")],
        config={"fact_schemas": {"note": {"type": "object"}}},
    )
    assert content.hash == PINNED_HASH
    assert content.flow_id == "flow_" + PINNED_HASH.removeprefix("sha256:")


def test_hash_is_over_ast_tools_config_only() -> None:
    ast = {"op": "call", "args": ["x"]}
    tools = [tool("z"), tool("a")]
    config = {"k": 1}
    content = normalize_flow(ast=ast, tools=tools, config=config)
    expected = sha256_of({"ast": ast, "tools": [tool("a"), tool("z")], "config": config})
    assert content.hash == expected


def test_flow_id_for() -> None:
    assert flow_id_for("sha256:abc123") == "flow_abc123"
    content = flow()
    hexpart = content.hash.removeprefix("sha256:")
    assert content.hash.startswith("sha256:")
    assert len(hexpart) == 64
    assert content.flow_id == f"flow_{hexpart}"


def test_tool_order_is_not_material() -> None:
    t1 = tool("alpha", {"type": "object", "properties": {"q": {"type": "string"}}})
    t2 = tool("beta", {"type": "object"})
    t3 = tool("gamma", True)
    a = flow(tools=[t1, t2, t3])
    b = flow(tools=[t3, t1, t2])
    c = flow(tools=[t2, t3, t1])
    assert a.hash == b.hash == c.hash
    assert a.flow_id == b.flow_id == c.flow_id
    assert a.tools == b.tools == c.tools
    assert [t["name"] for t in a.tools] == ["alpha", "beta", "gamma"]


def test_key_order_and_nfc_are_not_material() -> None:
    a = flow(ast={"b": 1, "a": "caf\u00e9"}, config={"y": 1.0, "x": [1]})
    b = flow(ast={"a": "cafe\u0301", "b": 1.0}, config={"x": [1.0], "y": 1})
    assert a.hash == b.hash


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"ast": {"v": 1}}, {"ast": {"v": 2}}),
        ({"ast": [1, 2]}, {"ast": [2, 1]}),
        ({"config": {}}, {"config": {"retries": 1}}),
        ({"tools": [tool("a")]}, {"tools": []}),
        ({"tools": [tool("a")]}, {"tools": [tool("b")]}),
        ({"tools": [tool("a")]}, {"tools": [tool("a", description="does a")]}),
        ({"tools": [tool("a")]}, {"tools": [tool("a", {"type": "string"})]}),
    ],
)
def test_material_changes_change_the_hash(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert flow(**left).hash != flow(**right).hash


def test_same_content_same_hash_repeatedly() -> None:
    hashes = {flow(ast={"n": i % 2}).hash for i in range(6)}
    assert len(hashes) == 2


def test_labels_are_not_an_input() -> None:
    params = inspect.signature(normalize_flow).parameters
    assert set(params) == {"ast", "tools", "config", "limits"}  # limits refuse, never hash
    with pytest.raises(TypeError):
        normalize_flow(ast={}, tools=[], config={}, labels={"team": "a"})  # type: ignore[call-arg]


def test_content_is_normalized() -> None:
    content = flow(ast={"x": 1.0, "s": "e\u0301"}, config={"t": 2.0})
    assert content.ast == {"x": 1, "s": "\u00e9"}
    assert isinstance(content.ast["x"], int)
    assert content.config == {"t": 2}


def test_empty_flow() -> None:
    content = normalize_flow(ast=None, tools=[], config={})
    assert content.ast is None
    assert content.tools == []
    assert content.hash == sha256_of({"ast": None, "tools": [], "config": {}})


def test_inputs_not_mutated() -> None:
    tools = [tool("b"), tool("a")]
    normalize_flow(ast={"a": 1}, tools=tools, config={})
    assert [t["name"] for t in tools] == ["b", "a"]


# --- tool validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_schema",
    [{"type": "nope"}, {"minimum": "a"}, {"required": "x"}, 5, "object", None, []],
    ids=["bad-type", "bad-minimum", "bad-required", "int", "str", "none", "list"],
)
def test_invalid_tool_parameters_schema(bad_schema: Any) -> None:
    tools = [tool("a"), tool("b", bad_schema), tool("c")]
    with pytest.raises(InvalidParams) as info:
        flow(tools=tools)
    assert _field_of(info.value) == "tools[1].parameters"
    assert "JSON Schema" in info.value.message


def test_invalid_schema_index_is_input_index_not_sorted_index() -> None:
    with pytest.raises(InvalidParams) as info:
        flow(tools=[tool("z"), tool("y"), tool("a", {"type": 3})])
    assert _field_of(info.value) == "tools[2].parameters"


@pytest.mark.parametrize("schema", [True, False, {}, {"type": "object", "required": ["q"]}])
def test_valid_tool_parameters_schemas(schema: Any) -> None:
    assert flow(tools=[tool("a", schema)]).tools[0]["parameters"] == schema


def test_duplicate_tool_names_refused() -> None:
    with pytest.raises(InvalidParams) as info:
        flow(tools=[tool("a"), tool("b"), tool("a", {"type": "string"})])
    assert _field_of(info.value) == "tools[2].name"
    assert "'a'" in info.value.message


def test_identical_duplicate_tools_refused() -> None:
    with pytest.raises(InvalidParams) as info:
        flow(tools=[tool("a"), tool("a")])
    assert _field_of(info.value) == "tools[1].name"


def test_tool_names_equal_after_nfc_refused() -> None:
    tools = [tool("e\u0301", {"type": "object"}), tool("\u00e9", {"type": "string"})]
    with pytest.raises(InvalidParams):
        flow(tools=tools)


def test_tool_order_not_material_for_names_equal_after_nfc() -> None:
    t1 = tool("e\u0301", {"type": "object"})
    t2 = tool("\u00e9", {"type": "string"})
    try:
        a = flow(tools=[t1, t2])
        b = flow(tools=[t2, t1])
    except InvalidParams:
        return  # refusing them as duplicates is a correct answer too
    assert a.hash == b.hash


# --- config.fact_schemas -----------------------------------------------------------------------


def test_fact_schemas_valid() -> None:
    config = {"fact_schemas": {"note": {"type": "object"}, "score": {"type": "number"}}}
    assert flow(config=config).config == config


def test_fact_schemas_absent_is_fine() -> None:
    assert flow(config={"other": 1}).config == {"other": 1}


@pytest.mark.parametrize("bad", [[], "x", 1, [{"type": "object"}]])
def test_fact_schemas_must_be_a_mapping(bad: Any) -> None:
    with pytest.raises(InvalidParams) as info:
        flow(config={"fact_schemas": bad})
    assert _field_of(info.value) == "config.fact_schemas"


@pytest.mark.parametrize("bad_schema", [{"type": "nope"}, 5, None, {"properties": 1}])
def test_fact_schema_invalid(bad_schema: Any) -> None:
    config = {"fact_schemas": {"good": {"type": "object"}, "note": bad_schema}}
    with pytest.raises(InvalidParams) as info:
        flow(config=config)
    assert _field_of(info.value) == "config.fact_schemas.note"


# --- canonical refusals carry the flow path ----------------------------------------------------


def test_nan_in_ast_names_ast_path() -> None:
    with pytest.raises(InvalidParams) as info:
        flow(ast={"x": [0, math.nan]})
    assert _field_of(info.value) == "ast.x[1]"


def test_nan_in_config_names_config_path() -> None:
    with pytest.raises(InvalidParams) as info:
        flow(config={"limit": math.inf})
    assert _field_of(info.value) == "config.limit"


def test_nan_in_tool_names_tool_path() -> None:
    with pytest.raises(InvalidParams) as info:
        flow(tools=[tool("a"), tool("b", {"type": "number", "maximum": 1}, extra=math.nan)])
    assert _field_of(info.value) == "tools[1].extra"
