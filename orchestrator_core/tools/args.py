"""Tool arguments against the tool's JSON Schema 2020-12: every error, each with the RFC 6901
pointer of the value it is about.

A missing required property points where it should be (``/b``, not the object holding it),
and an unexpected property points at itself, so a client can mark the exact field. An
``anyOf``/``oneOf`` failure is one error at the value, not one per branch. Values quoted in
messages are cut to about 80 characters.

Validation runs on ``orchestrator_core.schemas``: RE2 regexes, a deadline
(``validation.deadline_s``: 413 past it), at most ``validation.max_errors`` errors listed
(the rest counted), and, for arguments costly against their schema, off the event loop when
the caller can (``schemas.bounds``). Validators are compiled once per schema and kept in an
LRU: the same tool is checked on every call. Schemas are assumed to have passed
``schemas.rules`` (``orchestrator_core.flows`` checks them when a tool is declared).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError

from orchestrator_core.errors import ToolArgsInvalid
from orchestrator_core.schemas.bounds import ValidationTimeout, current, deadline, timed_out
from orchestrator_core.schemas.cost import checked
from orchestrator_core.schemas.instance import Found, find_errors
from orchestrator_core.schemas.validator import additional, validator_for

__all__ = ["ArgError", "arg_errors", "check_args", "pointer_of", "validator_for"]

_MAX_REPR = 80
_MAX_MESSAGE = 200
_LISTED = re.compile(r"\((.*) (?:was|were) (?:unexpected|unevaluated and invalid)\)$", re.S)


@dataclass(frozen=True, order=True)
class ArgError:
    """One way the arguments break the schema; ``pointer`` is ``""`` for the arguments."""

    pointer: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"pointer": self.pointer, "message": self.message}


def pointer_of(path: Iterable[Any]) -> str:
    """RFC 6901: ``~`` is ``~0`` and ``/`` is ``~1`` inside a token."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _message(error: ValidationError) -> str:
    message = error.message
    whole = repr(error.instance)
    if len(whole) > _MAX_REPR:
        message = message.replace(whole, _short(error.instance))
    if len(message) > _MAX_MESSAGE:  # a long enum or pattern from the schema itself
        message = message[: _MAX_MESSAGE - 3] + "..."
    return message


def _unevaluated(message: str) -> list[str] | None:
    """The property names an ``unevaluatedProperties`` message lists, or None if unparsable."""
    # jsonschema gives the names only in its message, as reprs between fixed words
    match = _LISTED.search(message)
    if match is None:
        return None
    try:
        names = ast.literal_eval(f"[{match.group(1)}]")
    except (ValueError, SyntaxError):
        return None
    if not names or not all(isinstance(n, str) for n in names):
        return None
    return list(names)


def _errors_of(error: ValidationError) -> Iterable[ArgError]:
    path = list(error.absolute_path)
    instance, kind, value = error.instance, error.validator, error.validator_value
    if isinstance(instance, dict):
        if kind == "required" and isinstance(value, list):
            return [
                ArgError(pointer_of([*path, name]), "is required")
                for name in value
                if name not in instance
            ]
        if kind == "dependentRequired" and isinstance(value, dict):
            return [
                ArgError(pointer_of([*path, name]), f"is required when {present!r} is given")
                for present, names in value.items()
                if present in instance
                for name in names
                if name not in instance
            ]
        if kind == "additionalProperties" and value is False:
            extra = additional(instance, error.schema)  # lazily: 200,000 of them is an attack
            return (ArgError(pointer_of([*path, name]), "is not allowed") for name in extra)
        if kind == "unevaluatedProperties":
            names = _unevaluated(error.message)
            if names is not None:
                text = (
                    "is not allowed"
                    if value is False
                    else "is not valid under unevaluatedProperties"
                )
                return [ArgError(pointer_of([*path, name]), text) for name in names]
    return [ArgError(pointer_of(path), _message(error))]


def _count_of(error: ValidationError) -> int:
    """How many errors ``_errors_of`` would make of ``error``, without making them."""
    instance, kind, value = error.instance, error.validator, error.validator_value
    if isinstance(instance, dict):
        if kind == "required" and isinstance(value, list):
            return sum(1 for name in value if name not in instance)
        if kind == "additionalProperties" and value is False:
            return len(additional(instance, error.schema))
        if kind in ("dependentRequired", "unevaluatedProperties"):
            return sum(1 for _ in _errors_of(error))
    return 1


def _found(schema: dict[str, Any], args: Any) -> Found[ArgError]:
    return find_errors(schema, args, _errors_of, _count_of, field="input.args")


def arg_errors(schema: dict[str, Any], args: Any) -> list[ArgError]:
    """The ways ``args`` break ``schema``, sorted by pointer then message, at most
    ``validation.max_errors`` of them; empty if none. Checked here, under the deadline: one
    past it is an error at the arguments."""
    try:
        with deadline(current().deadline_s):
            return _found(schema, args).listed
    except ValidationTimeout:
        return [ArgError("", "could not be checked against the schema within the deadline")]


def check_args(tool: str, schema: dict[str, Any], args: Any) -> None:
    """Raise ``ToolArgsInvalid`` listing the errors (at most ``validation.max_errors``, and
    how many more) when ``args`` break ``schema``; ``TooLarge`` when the check outlasts the
    deadline. Costly arguments are checked off the event loop when the caller can."""
    checked(b"args:", schema, args, lambda: _check_now(tool, schema, args))


def _check_now(tool: str, schema: dict[str, Any], args: Any) -> None:
    try:
        found = _found(schema, args)
    except ValidationTimeout:
        raise timed_out("input.args") from None
    if found.listed:
        raise ToolArgsInvalid(tool, [e.as_dict() for e in found.listed], **found.counts())
