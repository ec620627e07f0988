"""What checking a value against a schema may cost, reckoned before it runs, to choose where
it runs (``bounds.bounded_call``: on the event loop when cheap, else on a worker thread).

The unit is one subschema applied to one part of a value (an object, an array, a string...):
from 0.5 to 5 microseconds on jsonschema, measured (20 string properties: 0.5; 100 items
against a 50-branch ``anyOf``: 4.8; 5,000 properties under ``additionalProperties``: 5.4).
A regex costs a string up to one step per RE2 instruction per character, about
:data:`REGEX_STEPS_PER_UNIT` of them to a unit at worst (``bounds.NS_PER_REGEX_UNIT``).

A schema's weight, its subschemas with references expanded and its regexes' instructions,
is learnt with its first check (compiling its regexes can take RE2 tens of milliseconds
each), which is therefore run off the loop; until then the check counts as costly.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator_core.errors import OrchestratorError
from orchestrator_core.regexes import RegexError, schema_regex
from orchestrator_core.schemas.bounds import bounded_call, current
from orchestrator_core.schemas.graph import SchemaGraph
from orchestrator_core.schemas.validator import key_of

T = TypeVar("T")

REGEX_STEPS_PER_UNIT = 64
_UNREADABLE = 1_000_000  # the nodes of a schema the graph cannot read (stored before the rules)


@dataclass(frozen=True)
class Weight:
    nodes: int  # subschemas a part of a value may meet, references expanded
    regex_steps: int  # RE2 instructions a character may meet, over all the schema's regexes


def weight_of(schema: Any) -> Weight:
    try:
        graph = SchemaGraph(schema, field="")
    except OrchestratorError:
        return Weight(_UNREADABLE, 0)
    steps = 0
    for node in graph.nodes:
        for _, pattern in node.patterns():
            try:
                steps += schema_regex(pattern).units
            except RegexError:
                continue
    return Weight(graph.cost(_UNREADABLE).nodes, steps)


class _Weights:
    """Weights by schema key, once learnt (a bounded LRU, read on the loop, learnt on the
    worker threads)."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._known: OrderedDict[bytes, Weight] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> Weight | None:
        with self._lock:
            weight = self._known.get(key)
            if weight is not None:
                self._known.move_to_end(key)
            return weight

    def learn(self, key: bytes, schema: Any) -> None:
        if self.get(key) is not None:
            return
        weight = weight_of(schema)
        with self._lock:
            self._known[key] = weight
            while len(self._known) > self._size:
                self._known.popitem(last=False)


_WEIGHTS = _Weights()


def work_of(value: Any, weight: Weight, *, extra_steps: int = 0, limit: float) -> float:
    """Units checking ``value`` costs at ``weight`` (plus ``extra_steps`` RE2 instructions per
    character: redaction); the walk stops as soon as it passes ``limit`` (infinity then), so
    it costs the loop at most ``limit / weight.nodes`` steps."""
    per_char = (weight.regex_steps + extra_steps) / REGEX_STEPS_PER_UNIT
    work = 0.0
    stack: list[Iterator[tuple[str, Any]]] = [iter((("", value),))]
    while stack:
        pair = next(stack[-1], None)
        if pair is None:
            stack.pop()
            continue
        name, item = pair
        work += weight.nodes + len(name) * per_char
        if isinstance(item, str):
            work += len(item) * per_char
        elif isinstance(item, dict):
            stack.append(iter(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.append(zip(itertools.repeat(""), item, strict=False))
        if work > limit:
            return math.inf
    return work


def regex_steps(patterns: Iterable[Any]) -> int:
    """RE2 instructions a character meets when every one of ``patterns`` is matched."""
    return sum(getattr(p, "units", 1) for p in patterns)


def checked(
    kind: bytes, schema: Any, instance: Any, check: Callable[[], T], *, extra_steps: int = 0
) -> T:
    """``check()`` where it belongs: here when ``instance`` is cheap to check against
    ``schema``, else off the event loop when the caller can (``bounds.bounded_call``): a
    schema not seen before, or a value heavy for it. ``kind`` tells checks of one value
    against one schema apart (tool args, fact data); ``extra_steps``: RE2 instructions per
    character the check matches besides (redaction: :func:`regex_steps`)."""
    key = key_of(schema)

    def work() -> float:
        weight = _WEIGHTS.get(key)
        if weight is None:
            return math.inf
        return work_of(instance, weight, extra_steps=extra_steps, limit=current().inline_max_work)

    def learning() -> T:
        _WEIGHTS.learn(key, schema)
        return check()

    return bounded_call(kind + key, instance, work, learning)
