"""Tool arguments against the tool's JSON Schema 2020-12: every error, each with the RFC 6901
pointer of the value it is about.

A missing required property points where it should be (``/b``, not the object holding it),
and an unexpected property points at itself, so a client can mark the exact field.
Validators are compiled once per schema: the same tool is checked on every call.
"""

from __future__ import annotations

import ast
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import ToolArgsInvalid

_CACHE_SIZE = 512
_validators: OrderedDict[str, Draft202012Validator] = OrderedDict()
_EXTRA = re.compile(r"'((?:[^'\\]|\\.)*)' (?:was|were) unexpected")
_MAX_REPR = 80


@dataclass(frozen=True, order=True)
class ArgError:
    pointer: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"pointer": self.pointer, "message": self.message}


def pointer_of(path: Iterable[Any]) -> str:
    """RFC 6901: ``~`` is ``~0`` and ``/`` is ``~1`` inside a token."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def validator_for(schema: dict[str, Any]) -> Draft202012Validator:
    key = sha256_of(schema)
    found = _validators.get(key)
    if found is None:
        found = Draft202012Validator(schema)
        _validators[key] = found
        if len(_validators) > _CACHE_SIZE:
            _validators.popitem(last=False)
    else:
        _validators.move_to_end(key)
    return found


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _errors_of(error: ValidationError) -> list[ArgError]:
    path = list(error.absolute_path)
    if error.validator == "required":
        # one error per missing property; its message is "<repr of name> is a required ..."
        head = error.message.removesuffix(" is a required property")
        try:
            missing = ast.literal_eval(head)
        except (ValueError, SyntaxError):
            return [ArgError(pointer_of(path), error.message)]
        return [ArgError(pointer_of([*path, missing]), "is required")]
    if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(
        error.instance, dict
    ):
        allowed = set((error.schema or {}).get("properties", {}))  # type: ignore[union-attr]
        extra = [k for k in error.instance if k not in allowed] or _EXTRA.findall(error.message)
        return [ArgError(pointer_of([*path, k]), "is not allowed") for k in sorted(extra)]
    message = error.message
    if len(message) > 200:
        message = f"{_short(error.instance)} fails {error.validator!r}"
    return [ArgError(pointer_of(path), message)]


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
