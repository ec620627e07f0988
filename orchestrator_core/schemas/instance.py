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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import referencing.exceptions
from jsonschema.exceptions import ValidationError

from orchestrator_core.errors import InvalidParams, TooLarge
from orchestrator_core.schemas.bounds import ValidationTimeout, current, timed_out
from orchestrator_core.schemas.validator import validator_for

E = TypeVar("E")


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
