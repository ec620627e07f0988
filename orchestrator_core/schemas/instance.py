"""A value against a client's schema: the errors, at most ``validation.max_errors`` of them
listed and the rest counted, under the deadline (``bounds.py``).

Invalid arguments with 200,000 unexpected keys are one error per key: listing them all made
a 4.8 MB answer. The first ``max_errors`` found are listed (sorted); the others are counted
while the deadline allows, and the answer says how many more there were, and whether the
count stopped at the deadline. A deadline met before any error is found is
:class:`~orchestrator_core.schemas.bounds.ValidationTimeout`: the caller answers 413.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
import referencing.exceptions
from jsonschema.exceptions import ValidationError

from orchestrator_core.errors import InvalidParams, OrchestratorError, TooLarge
from orchestrator_core.regexes import RegexError, schema_regex
from orchestrator_core.schemas.bounds import ValidationTimeout, bounded_call, current, timed_out
from orchestrator_core.schemas.graph import SchemaGraph
from orchestrator_core.schemas.validator import key_of, validator_for

E = TypeVar("E")

# A value's JSON byte against a schema node: well under a microsecond (bounds.py); a regex
# instruction against a character costs about this many times less at worst.
_REGEX_UNITS_PER_NODE = 30
_UNKNOWN_WEIGHT = 1_000_000  # a schema the graph cannot read (stored before the rules)


@dataclass(frozen=True)
class Found(Generic[E]):
    listed: list[E]  # sorted, at most max_errors
    not_listed: int  # errors found beyond the list
    cut_short: bool  # the deadline stopped the search: there may be more

    def counts(self) -> dict[str, Any]:
        """The rest, as ``ToolArgsInvalid`` takes it."""
        return {"not_listed": self.not_listed, "cut_short": self.cut_short}

    def details(self) -> dict[str, Any]:
        """What an error body adds to its list (nothing when the list is whole)."""
        if not self.not_listed and not self.cut_short:
            return {}
        return {"errors_not_listed": self.not_listed, "errors_cut_short": self.cut_short}

    def more(self) -> str:
        """``" (and N more)"``, as a message ends, or ``""``."""
        extra = len(self.listed) - 1 + self.not_listed
        if self.cut_short:
            return f" (and at least {extra} more; the search stopped at the deadline)"
        return f" (and {extra} more)" if extra > 0 else ""


def find_errors(
    schema: Any,
    instance: Any,
    expand: Callable[[ValidationError], Iterable[E]],
    count: Callable[[ValidationError], int],
    *,
    field: str,
) -> Found[E]:
    """Every error of ``instance`` (``field``) against ``schema``: ``expand`` makes the
    listed ones, ``count`` says how many each of the rest stands for."""
    cap = current().max_errors
    listed: set[E] = set()
    more = 0
    cut = False
    try:
        for error in validator_for(schema).iter_errors(instance):
            room = cap - len(listed)
            taken = 0
            for item in itertools.islice(expand(error), max(room, 0)):
                listed.add(item)
                taken += 1
            more += max(0, count(error) - taken)
    except ValidationTimeout:
        if not listed:
            raise
        cut = True
    except RecursionError:
        raise ValidationTimeout from None  # as deep as the stack: no cheaper to finish
    except referencing.exceptions.Unresolvable as exc:  # a schema stored before the rules
        raise InvalidParams(
            f"cannot be checked: its schema has a reference that does not resolve inside it "
            f"({exc})",
            field=field,
        ) from None
    return Found(sorted(listed), more, cut)  # type: ignore[type-var]


class _Weights:
    """What one byte of a value can cost against a schema (:func:`weight_of`), by schema
    key, once learnt. Learning compiles the schema's regexes, which may take RE2 tens of
    milliseconds each, so it happens with the first check of a schema, off the loop."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._known: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()  # learnt on worker threads, read on the loop

    def get(self, key: bytes) -> int | None:
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


def weight_of(schema: Any) -> int:
    """Its subschemas with references expanded, plus its regexes' instructions (each costs a
    character at most ``_REGEX_UNITS_PER_NODE`` times less than a subschema costs a value)."""
    try:
        graph = SchemaGraph(schema, field="")
    except OrchestratorError:
        return _UNKNOWN_WEIGHT
    units = 0
    for node in graph.nodes:
        for _, pattern in node.patterns():
            try:
                units += schema_regex(pattern).units
            except RegexError:
                continue
    return graph.cost(_UNKNOWN_WEIGHT).nodes + units // _REGEX_UNITS_PER_NODE


def within_regex_bound(value: Any, patterns: Iterable[Any], *, field: str) -> None:
    """``TooLarge`` naming ``field`` when a string in ``value`` is too long to be matched by
    ``patterns`` within the deadline (RE2 runs without a clock: each match is one call)."""
    units = max((getattr(p, "units", 1) for p in patterns), default=0)
    if not units:
        return
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            size = len(item) if item.isascii() else 4 * len(item)
            if size * units > current().regex_units:
                raise TooLarge(
                    f"holds a string of {len(item)} characters, too long for the run's redact "
                    "patterns to be matched within the validation deadline",
                    limit="validation.deadline_s",
                    value=max(1, round(current().deadline_s)),
                    field=field,
                )
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)


def regex_weight(patterns: Iterable[Any]) -> int:
    """What matching each of ``patterns`` costs a byte, in schema nodes."""
    return sum(1 + getattr(p, "units", 1) // _REGEX_UNITS_PER_NODE for p in patterns)


def value_bytes(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # integers beyond 64 bits: rare, and never cheap to guess
        return len(json.dumps(value))


def checked(
    kind: bytes, schema: Any, instance: Any, check: Callable[[], E], *, extra_weight: int = 0
) -> E:
    """``check()`` where it belongs: here when ``instance`` is cheap to check against
    ``schema``, else off the event loop when the caller can (``bounds.bounded_call``): a
    schema not seen before, or a value heavy for it. ``kind`` tells checks of one value
    against one schema apart (tool args, fact data); ``extra_weight``: what the check does
    per byte besides (redaction: :func:`regex_weight`)."""
    key = key_of(schema)

    def work() -> float:
        weight = _WEIGHTS.get(key)
        return math.inf if weight is None else value_bytes(instance) * (weight + extra_weight)

    def learning() -> E:
        _WEIGHTS.learn(key, schema)
        return check()

    return bounded_call(kind + key, instance, work, learning)


# --- a JSON value against a schema, errors named as fields (fact data) -------------------------


def _field_of(base: str, error: ValidationError) -> str:
    return ".".join([base, *(str(p) for p in error.absolute_path)])


def check_data(schema: Any, data: Any, *, field: str = "data") -> None:
    """:class:`InvalidParams` listing each error with its field (``data.a.0.b``), up to the
    cap; a timeout is :func:`timed_out`."""
    try:
        found = find_errors(
            schema,
            data,
            lambda e: [(_field_of(field, e), e.message)],
            lambda e: 1,
            field=field,
        )
    except ValidationTimeout:
        raise timed_out(field) from None
    if not found.listed:
        return
    errors = [{"field": f, "message": m} for f, m in found.listed]
    first = errors[0]
    raise InvalidParams(
        first["message"] + (found.more() if found.details() else ""),
        field=first["field"],
        details={"errors": errors, **found.details()},
    )
