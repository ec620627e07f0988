"""A JSON Schema (2020-12) as a graph: its subschemas are the nodes, and each keyword that
applies a subschema is an edge, labelled with how it applies it.

- ``here`` edges apply their target to the same value: ``allOf``/``anyOf``/``oneOf``,
  ``not``, ``if``/``then``/``else``, ``dependentSchemas`` and ``$ref``/``$dynamicRef`` (to
  the subschema the reference resolves to, as the validator resolves it: ``$id``,
  ``$anchor``, JSON pointers);
- ``descend`` edges apply it to a part of the value: a property (``prop:<name>``), the
  other properties (``props``), the names (``keys``), the items (``items``) or one of them
  (``item:<i>``);
- ``defs`` edges (``$defs``, ``definitions``) hold subschemas that only a reference applies.

A reference must resolve inside the schema: the validator retrieves nothing, so a schema can
neither make the server fetch a URL nor lean on one. From the graph, :meth:`SchemaGraph.cost`
reckons what validation can cost: the nodes a value meets with every reference expanded (a
reference back to a subschema being expanded counts once: recursion is paid for by the
value's own depth), and the longest chain of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import referencing
import referencing.exceptions
from referencing.jsonschema import DRAFT202012

from orchestrator_core.errors import InvalidParams

EdgeKind = Literal["here", "descend", "defs"]

_HERE_ONE = ("not", "if", "then", "else")
_HERE_MANY = ("allOf", "anyOf", "oneOf")
_REFS = ("$ref", "$dynamicRef")
_DESCEND_ONE = {
    "additionalProperties": "props",
    "unevaluatedProperties": "props",
    "propertyNames": "keys",
    "items": "items",
    "contains": "items",
    "unevaluatedItems": "items",
}
_DEFS = ("$defs", "definitions")
LEAF = -1  # a boolean schema: applied, holds nothing


@dataclass(frozen=True)
class Edge:
    target: int  # a node's index, or LEAF
    kind: EdgeKind
    label: str  # for ``descend``: which part of the value
    where: str  # the keyword's path from the edge's node, e.g. ``.allOf[1]``


@dataclass
class Node:
    schema: dict[str, Any]
    path: str  # from the schema's root, in the field style: ``.properties.x``
    edges: list[Edge] = field(default_factory=list)

    def patterns(self) -> Iterator[tuple[str, str]]:
        """Its regexes, each with its path from the node: ``.pattern`` and the names of
        ``.patternProperties``."""
        pattern = self.schema.get("pattern")
        if isinstance(pattern, str):
            yield ".pattern", pattern
        named = self.schema.get("patternProperties")
        for name in named if isinstance(named, dict) else ():
            yield f".patternProperties.{name}", name


@dataclass(frozen=True)
class SchemaCost:
    nodes: int  # what a value meets with every reference expanded (capped: see ``cost``)
    depth: int  # the longest chain of them
    heaviest: str  # the deepest subschema whose expansion is past the cap, or ""


class SchemaGraph:
    """The subschemas of ``schema`` reachable from its root or held in ``$defs``."""

    def __init__(self, schema: Any, *, field: str) -> None:
        self.field = field
        self.nodes: list[Node] = []
        self._index: dict[int, int] = {}
        self._paths = _container_paths(schema)
        if isinstance(schema, dict):
            self._build(schema)

    def node_field(self, node: Node, suffix: str = "") -> str:
        return f"{self.field}{node.path}{suffix}"

    def applied(self, node: Node) -> Iterator[Edge]:
        """The edges that apply a subschema to a value (``here`` and ``descend``)."""
        return (e for e in node.edges if e.kind != "defs")

    # --- building ------------------------------------------------------------------------------

    def _build(self, root: dict[str, Any]) -> None:
        resource = DRAFT202012.create_resource(root)
        resolver = referencing.Registry().resolver_with_root(resource)  # nothing else
        self._add(root)
        todo = [(0, resolver)]
        while todo:
            index, resolver = todo.pop()
            node = self.nodes[index]
            for target, kind, label, where, by_ref in self._children(node, resolver):
                if isinstance(target, bool):
                    node.edges.append(Edge(LEAF, kind, label, where))
                    continue
                known = self._index.get(id(target))
                if known is None:
                    known = self._add(target)
                    # as the validator descends: a subschema's own $id is a new base URI
                    inner = by_ref if by_ref is not None else _within(resolver, target)
                    todo.append((known, inner))
                node.edges.append(Edge(known, kind, label, where))

    def _add(self, schema: dict[str, Any]) -> int:
        self._index[id(schema)] = len(self.nodes)
        self.nodes.append(Node(schema, self._paths.get(id(schema), "")))
        return len(self.nodes) - 1

    def _children(self, node: Node, resolver: Any) -> Iterator[tuple[Any, EdgeKind, str, str, Any]]:
        """(target, kind, label, where, the resolver a reference resolved with, or None)."""
        schema = node.schema
        for keyword in _REFS:
            ref = schema.get(keyword)
            if isinstance(ref, str):
                target, target_resolver = self._resolve(node, keyword, ref, resolver)
                yield target, "here", "", f".{keyword}", target_resolver
        for keyword in _HERE_ONE:
            if keyword in schema:
                yield schema[keyword], "here", "", f".{keyword}", None
        for keyword in _HERE_MANY:
            for i, sub in enumerate(_listed(schema.get(keyword))):
                yield sub, "here", "", f".{keyword}[{i}]", None
        for name, sub in _mapped(schema.get("dependentSchemas")):
            yield sub, "here", "", f".dependentSchemas.{name}", None
        for name, sub in _mapped(schema.get("properties")):
            yield sub, "descend", f"prop:{name}", f".properties.{name}", None
        for name, sub in _mapped(schema.get("patternProperties")):
            yield sub, "descend", "props", f".patternProperties.{name}", None
        for keyword, label in _DESCEND_ONE.items():
            if keyword in schema:
                yield schema[keyword], "descend", label, f".{keyword}", None
        for i, sub in enumerate(_listed(schema.get("prefixItems"))):
            yield sub, "descend", f"item:{i}", f".prefixItems[{i}]", None
        for keyword in _DEFS:
            for name, sub in _mapped(schema.get(keyword)):
                yield sub, "defs", "", f".{keyword}.{name}", None

    def _resolve(self, node: Node, keyword: str, ref: str, resolver: Any) -> tuple[Any, Any]:
        at = self.node_field(node, f".{keyword}")
        try:
            resolved = resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            raise InvalidParams(
                f"{ref!r} does not resolve inside the schema (a reference may name only a "
                "subschema of the same schema: nothing is fetched)",
                field=at,
            ) from None
        target = resolved.contents
        if isinstance(target, bool):
            return target, resolved.resolver
        if not isinstance(target, dict) or id(target) not in self._paths:
            raise InvalidParams(
                f"{ref!r} must name a subschema of this schema, an object or a boolean",
                field=at,
            )
        return target, resolved.resolver

    # --- what it costs -------------------------------------------------------------------------

    def cost(self, cap: int) -> SchemaCost:
        """Nodes met from the root with references expanded (each count capped at
        ``cap + 1``), and the longest chain; iterative, as a chain of references may be long."""
        n = len(self.nodes)
        if n == 0:
            return SchemaCost(1, 1, "")
        size, depth, state = [0] * n, [0] * n, [0] * n  # state: 0 new, 1 open, 2 done
        heaviest = ""
        stack: list[tuple[int, Iterator[Edge]]] = [(0, self.applied(self.nodes[0]))]
        state[0] = 1
        total = {0: (1, 1)}  # open node -> (size, depth) so far
        while stack:
            index, edges = stack[-1]
            edge = next(edges, None)
            if edge is None:
                stack.pop()
                size[index], depth[index] = total.pop(index)
                state[index] = 2
                if size[index] > cap and not heaviest:
                    heaviest = self.nodes[index].path
                if stack:
                    parent = stack[-1][0]
                    _grow(total, parent, size[index], depth[index], cap)
                continue
            target = edge.target
            if target == LEAF or state[target] == 1:  # a leaf, or recursion: once
                _grow(total, index, 1, 1, cap)
            elif state[target] == 2:
                _grow(total, index, size[target], depth[target], cap)
            else:
                state[target] = 1
                total[target] = (1, 1)
                stack.append((target, self.applied(self.nodes[target])))
        return SchemaCost(size[0], depth[0], heaviest)


def _within(resolver: Any, schema: dict[str, Any]) -> Any:
    if "$id" not in schema:
        return resolver
    return resolver.in_subresource(DRAFT202012.create_resource(schema))


def _grow(total: dict[int, tuple[int, int]], index: int, size: int, depth: int, cap: int) -> None:
    have_size, have_depth = total[index]
    total[index] = (min(have_size + size, cap + 1), max(have_depth, depth + 1))


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _mapped(value: Any) -> Iterator[tuple[str, Any]]:
    return iter(value.items()) if isinstance(value, dict) else iter(())


def _container_paths(schema: Any) -> dict[int, str]:
    """The path of every object and array in ``schema``, by identity (field style)."""
    paths: dict[int, str] = {}
    todo: list[tuple[Any, str]] = [(schema, "")]
    while todo:
        value, path = todo.pop()
        if isinstance(value, dict):
            paths.setdefault(id(value), path)
            todo.extend((v, f"{path}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            paths.setdefault(id(value), path)
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
    return paths
