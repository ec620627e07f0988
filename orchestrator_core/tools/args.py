"""Tool arguments against the tool's JSON Schema 2020-12: every error, each with the RFC 6901
pointer of the value it is about.

A missing required property points where it should be (``/b``, not the object holding it),
and an unexpected property points at itself, so a client can mark the exact field. An
``anyOf``/``oneOf`` failure is one error at the value, not one per branch. Values quoted in
messages are cut to about 80 characters.

Validators are compiled once per schema and kept in an LRU: the same tool is checked on
every call. Schemas are assumed valid (``orchestrator_core.flows`` checks them when a tool
is declared).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from orchestrator_core.errors import ToolArgsInvalid

_CACHE_SIZE = 512
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


def _key(schema: dict[str, Any]) -> bytes:
    # Exact JSON, not the canonical form: NFC normalization would make schemas naming
    # different property spellings share a validator. orjson keeps a hit cheap.
    try:
        return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits
        return json.dumps(schema, sort_keys=True).encode()


@lru_cache(maxsize=_CACHE_SIZE)
def _compiled(key: bytes) -> Draft202012Validator:
    # Compiled from the key's own copy: later changes to the caller's dict cannot make the
    # validator disagree with its key. json, not orjson, reads big integers exactly.
    return Draft202012Validator(json.loads(key))


def validator_for(schema: dict[str, Any]) -> Draft202012Validator:
    """The compiled validator of ``schema``, shared by every equal schema."""
    return _compiled(_key(schema))


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


def _errors_of(error: ValidationError) -> list[ArgError]:
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
            extra = _additional(instance, error.schema)
            return [ArgError(pointer_of([*path, name]), "is not allowed") for name in extra]
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


def _additional(instance: dict[str, Any], schema: Any) -> list[str]:
    # The rule of jsonschema's additionalProperties keyword, which keeps its own private.
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    patterns = "|".join(schema.get("patternProperties", {})) if isinstance(schema, dict) else ""
    return [
        name
        for name in instance
        if name not in properties and not (patterns and re.search(patterns, name))
    ]


def arg_errors(schema: dict[str, Any], args: Any) -> list[ArgError]:
    """Every way ``args`` breaks ``schema``, sorted by pointer then message; empty if none."""
    found: set[ArgError] = set()
    for error in validator_for(schema).iter_errors(args):
        found.update(_errors_of(error))
    return sorted(found)


def check_args(tool: str, schema: dict[str, Any], args: Any) -> None:
    """Raise ``ToolArgsInvalid`` listing every error when ``args`` break ``schema``."""
    errors = arg_errors(schema, args)
    if errors:
        raise ToolArgsInvalid(tool, [e.as_dict() for e in errors])
