"""Recursion in a schema graph (``graph.py``): what makes validation grow faster than the
value it checks.

A recursive schema (a tree node whose children are nodes) costs what the value holds, as
long as each part of the value meets each recursive subschema once. Two shapes break that:

- a cycle of ``here`` edges, references that never move into a part of the value
  (``a = {"$ref": a}``): the validator recurses until the stack runs out, whatever the value;
- a recursive subschema applied twice to one part of the value at each level of the
  recursion (``t = {"properties": {"c": {"allOf": [{"$ref": t}, {"$ref": t}]}}}``, or two
  ``oneOf`` branches that each take ``children`` back to ``t``): the work doubles with each
  level, 2**depth for a value ``depth`` levels deep.

The second is found per strongly connected component of the graph: from each of its
subschemas ``x``, the ``here`` paths are counted (to 2); another subschema of the component
met twice, or two ``descend`` edges of one label (the same property, the items...) into the
component, is a repeat. Two edges of one label may lead back at different parts further
down (then the schema would be safe): the rule refuses those too, and says how to write the
schema instead.
"""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator_core.schemas.graph import LEAF, Edge, Node, SchemaGraph


class TooComplex(Exception):
    """Finding repeats took more than the budget of steps."""


def here_cycle(graph: SchemaGraph) -> Node | None:
    """A subschema on a cycle of ``here`` edges, or None."""
    state = [0] * len(graph.nodes)  # 0 new, 1 open, 2 done
    for start in range(len(graph.nodes)):
        if state[start]:
            continue
        state[start] = 1
        stack: list[tuple[int, Iterator[Edge]]] = [(start, _here(graph.nodes[start]))]
        while stack:
            index, edges = stack[-1]
            edge = next(edges, None)
            if edge is None:
                state[index] = 2
                stack.pop()
            elif state[edge.target] == 1:
                return graph.nodes[edge.target]
            elif state[edge.target] == 0:
                state[edge.target] = 1
                stack.append((edge.target, _here(graph.nodes[edge.target])))
    return None


def repeated_recursion(graph: SchemaGraph, *, budget: int) -> tuple[Node, str] | None:
    """A recursive subschema and the part of the value (a label, or ``""`` for the value
    itself) that meets the recursion twice per level; None when there is none. Assumes no
    ``here`` cycle (:func:`here_cycle`)."""
    component = _components(graph)
    steps = 0
    for x, node in enumerate(graph.nodes):
        if component[x] < 0:  # on no cycle
            continue
        counts = _here_paths(graph, x)
        steps += len(counts)
        per_label: dict[str, int] = {}
        for y, count in counts.items():
            if y != x and count > 1 and component[y] == component[x]:
                return node, ""
            for edge in graph.nodes[y].edges:
                steps += 1
                if edge.kind != "descend" or edge.target == LEAF:
                    continue
                if component[edge.target] == component[x]:
                    per_label[edge.label] = per_label.get(edge.label, 0) + count
                    if per_label[edge.label] > 1:
                        return node, edge.label
        if steps > budget:
            raise TooComplex
    return None


def _here(node: Node) -> Iterator[Edge]:
    return (e for e in node.edges if e.kind == "here" and e.target != LEAF)


def _here_paths(graph: SchemaGraph, start: int) -> dict[int, int]:
    """The subschemas ``here`` edges reach from ``start``, each with its number of paths
    (counted to 2)."""
    order: list[int] = []  # reverse topological, by a post-order walk
    seen = {start}
    stack: list[tuple[int, Iterator[Edge]]] = [(start, _here(graph.nodes[start]))]
    while stack:
        index, edges = stack[-1]
        edge = next(edges, None)
        if edge is None:
            order.append(index)
            stack.pop()
        elif edge.target not in seen:
            seen.add(edge.target)
            stack.append((edge.target, _here(graph.nodes[edge.target])))
    counts = dict.fromkeys(seen, 0)
    counts[start] = 1
    for index in reversed(order):
        for edge in _here(graph.nodes[index]):
            counts[edge.target] = min(2, counts[edge.target] + counts[index])
    return counts


def _components(graph: SchemaGraph) -> list[int]:
    """Tarjan's strongly connected components over the applied edges: each node's
    component, or -1 for a node on no cycle."""
    n = len(graph.nodes)
    index_of, low = [-1] * n, [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    component = [-1] * n
    counter = 0
    for root in range(n):
        if index_of[root] >= 0:
            continue
        work: list[tuple[int, Iterator[Edge]]] = [(root, graph.applied(graph.nodes[root]))]
        index_of[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, edges = work[-1]
            edge = next(edges, None)
            if edge is not None:
                w = edge.target
                if w == LEAF:
                    continue
                if index_of[w] < 0:
                    index_of[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, graph.applied(graph.nodes[w])))
                elif on_stack[w]:
                    low[v] = min(low[v], index_of[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index_of[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    members.append(w)
                    if w == v:
                        break
                looped = len(members) > 1 or any(
                    e.target == v for e in graph.applied(graph.nodes[v])
                )
                if looped:
                    for w in members:
                        component[w] = v
    return component
