"""What a client's JSON Schema must pass when a flow declares it (a tool's ``parameters``, a
``config.fact_schemas`` entry), as ordered rules: each reads the declared schema and refuses
it with an error naming the field (``tools[0].parameters.properties.x.pattern``), or lets it
through to the next.

They refuse what would make validation explode, measured on the validator (issue figures):
a ``$ref`` chain that doubles at each step (5.3 s at depth 16 for a schema under 1 KB),
``uniqueItems`` over objects (quadratic: 14 s for 3,000), a regex RE2 cannot run, a
reference out of the schema (the validator would fetch it), recursion without end or that
doubles per level of the value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator_core.canonical import canonical_json
from orchestrator_core.errors import InvalidParams, TooLarge
from orchestrator_core.regexes import check_schema_regex
from orchestrator_core.schemas.bounds import (
    ValidationTimeout,
    check_deadline,
    current,
    deadline,
    timed_out,
)
from orchestrator_core.schemas.graph import SchemaCost, SchemaGraph
from orchestrator_core.schemas.recursion import TooComplex, here_cycle, repeated_recursion
from orchestrator_core.schemas.validator import meta_error

# The longest chain of subschemas a value may meet, references followed: jsonschema recurses
# about three Python frames per subschema, and a chain of 500 references already ran out of
# the interpreter's 1,000.
MAX_CHAIN = 128
_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})


@dataclass(frozen=True)
class SchemaLimits:
    """Settings ``limits.max_tool_schema_bytes`` and ``validation.*``, as the rules use them."""

    max_bytes: int = 65536
    max_nodes: int = 10_000
    max_unique_items: int = 1_000


@dataclass
class Declared:
    """A schema as declared: where (``field``), what, and the limits it answers to."""

    schema: Any
    field: str
    limits: SchemaLimits

    @functools.cached_property
    def graph(self) -> SchemaGraph:
        return SchemaGraph(self.schema, field=self.field)

    @functools.cached_property
    def cost(self) -> SchemaCost:
        return self.graph.cost(self.limits.max_nodes)


class SchemaRule(Protocol):
    def check(self, declared: Declared) -> None:
        """Return when the schema passes; raise an error naming the field when not."""
        ...


class Size:
    """At most ``limits.max_tool_schema_bytes`` of canonical JSON (tools are refused by
    ``FlowLimits`` first, with their own wording)."""

    def check(self, declared: Declared) -> None:
        size = len(canonical_json(declared.schema))
        limit = declared.limits.max_bytes
        if size > limit:
            raise TooLarge(
                f"a JSON Schema is at most {limit} bytes of canonical JSON, not {size}",
                limit="limits.max_tool_schema_bytes",
                value=limit,
                field=declared.field,
            )


class MetaSchema:
    """A valid JSON Schema 2020-12 (its regexes are the next rules' to judge)."""

    def check(self, declared: Declared) -> None:
        message = meta_error(declared.schema)
        if message is not None:
            raise InvalidParams(f"not a valid JSON Schema 2020-12: {message}", field=declared.field)


class LocalReferences:
    """Every ``$ref`` and ``$dynamicRef`` names a subschema of the same schema."""

    def check(self, declared: Declared) -> None:
        declared.graph  # noqa: B018 (reading the graph resolves every reference)


class Regexes:
    """Every ``pattern`` and ``patternProperties`` name is a regex RE2 runs."""

    def check(self, declared: Declared) -> None:
        graph = declared.graph
        for node in graph.nodes:
            for where, pattern in node.patterns():
                check_deadline()  # RE2 may take milliseconds to compile a Unicode class
                check_schema_regex(pattern, field=graph.node_field(node, where))


class NoEndlessReference:
    """No cycle of references that never moves into a part of the value."""

    def check(self, declared: Declared) -> None:
        node = here_cycle(declared.graph)
        if node is not None:
            raise InvalidParams(
                "this subschema applies itself to the same value through its references: "
                "validation would recurse without end",
                field=declared.graph.node_field(node),
            )


class BoundedExpansion:
    """With references expanded, at most ``validation.max_schema_nodes`` subschemas, in
    chains of at most ``MAX_CHAIN``."""

    def check(self, declared: Declared) -> None:
        cost, limit = declared.cost, declared.limits.max_nodes
        graph = declared.graph
        if cost.nodes > limit:
            raise InvalidParams(
                f"with its references expanded, this subschema applies over {limit} "
                "subschemas to a value (validation.max_schema_nodes): share them instead of "
                "referring to them more than once",
                field=f"{graph.field}{cost.heaviest}",
                details={"limit": "validation.max_schema_nodes", "value": limit},
            )
        if cost.depth > MAX_CHAIN:
            raise InvalidParams(
                f"with its references followed, the schema chains {cost.depth} subschemas, "
                f"more than {MAX_CHAIN}",
                field=graph.field,
            )


class NoRepeatedRecursion:
    """A recursive subschema meets each part of the value once per level, not twice."""

    def check(self, declared: Declared) -> None:
        graph = declared.graph
        try:
            found = repeated_recursion(graph, budget=20 * declared.limits.max_nodes)
        except TooComplex:
            raise InvalidParams(
                "the schema's recursion is too intricate to check", field=graph.field
            ) from None
        if found is None:
            return
        node, label = found
        part = "the same value" if not label else f"the same {_part(label)}"
        raise InvalidParams(
            f"this recursive subschema is applied twice to {part} at each level of the "
            "recursion: validation would double with each level of the value. Apply the "
            "recursion once (move what the branches share out of them)",
            field=graph.node_field(node),
        )


class BoundedUniqueItems:
    """``uniqueItems`` over items that may be objects or arrays needs ``maxItems`` of at most
    ``validation.max_unique_items``."""

    def check(self, declared: Declared) -> None:
        limit = declared.limits.max_unique_items
        for node in declared.graph.nodes:
            schema = node.schema
            if schema.get("uniqueItems") is not True or _scalar_items(schema):
                continue
            most = schema.get("maxItems")
            if not isinstance(most, int) or most > limit:
                raise InvalidParams(
                    f"uniqueItems over items that may be objects or arrays needs maxItems of "
                    f"at most {limit} (validation.max_unique_items)",
                    field=declared.graph.node_field(node, ".uniqueItems"),
                    details={"limit": "validation.max_unique_items", "value": limit},
                )


RULES: tuple[SchemaRule, ...] = (
    Size(),
    MetaSchema(),
    LocalReferences(),
    Regexes(),
    NoEndlessReference(),
    BoundedExpansion(),
    NoRepeatedRecursion(),
    BoundedUniqueItems(),
)


def check_schema(schema: Any, *, field: str, limits: SchemaLimits | None = None) -> None:
    """Apply every rule in order, within ``validation.deadline_s``; the first to refuse
    raises."""
    declared = Declared(schema, field, limits or SchemaLimits())
    try:
        with deadline(current().deadline_s):
            for rule in RULES:
                rule.check(declared)
    except ValidationTimeout:
        raise timed_out(field) from None


def _part(label: str) -> str:
    kind, _, name = label.partition(":")
    return {
        "prop": f"property {name!r}",
        "item": f"item {name}",
        "items": "items",
        "props": "properties",
        "keys": "property names",
    }[kind]


def _scalar_items(schema: dict[str, Any]) -> bool:
    """Whether every item is a string, number, boolean or null, by ``items``' own type."""
    if schema.get("items") is False:
        return True  # at most the prefixItems: bounded by the schema itself
    items = schema.get("items")
    if not isinstance(items, dict):
        return False
    kind = items.get("type")
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else None
    if kinds is not None:
        return kinds <= _SCALARS
    for key in ("enum", "const"):
        if key in items:
            values = items[key] if key == "enum" else [items[key]]
            return isinstance(values, list) and not any(isinstance(v, (dict, list)) for v in values)
    return False
