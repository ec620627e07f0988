"""JSON for a JSON Schema, deterministic per seed: the sim engine's "constrained decoding".

It follows the schema (``type`` object/array/string/integer/number/boolean/null or a list of
them, ``enum``, ``const``, ``anyOf`` / ``oneOf`` (one branch), ``properties`` /
``required`` (every required property, each optional one with probability 0.5), ``items``,
``minItems`` / ``maxItems`` (arrays keep to 1-3 items unless the schema says otherwise),
``minimum`` / ``maximum``, ``minLength`` / ``maxLength`` and local ``$ref``), but imperfectly
on purpose, so clients see what a real model can do:

- with probability ``error_p`` (default 0.2) each object breaks its schema: one required
  property is dropped, or one value gets a type its schema refuses;
- with probability ``unknown_p`` (default 0.05) each string ``const`` becomes
  ``"unknown_tool"`` (in a plan: a call of a tool that does not exist).

A property whose schema is a ``const`` is never dropped nor retyped by the first rule, so a
plan's call always names a tool, and names an unknown one only by the second. Other keywords
(``allOf``, ``pattern``, ``format``, ``uniqueItems``, ...) are ignored.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

_WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "signal", "prime")
_PIECE = re.compile(r'"(?:[^"\\]|\\.)*"|\s+|[{}\[\],:]|[^\s{}\[\],:"]+')
# Tried in order: the first one a schema refuses replaces a value to break an object.
_WRONG: tuple[Any, ...] = ("seven", 7, False)
_CANNOT_BREAK = object()
_MAX_DEPTH = 8
UNKNOWN_TOOL = "unknown_tool"


class SchemaSampler:
    def __init__(
        self, rng: random.Random, *, error_p: float = 0.2, unknown_p: float = 0.05
    ) -> None:
        self.rng = rng
        self.error_p = error_p
        self.unknown_p = unknown_p
        self._root: Any = None

    def sample(self, schema: Any) -> Any:
        """A value for ``schema``; local ``$ref`` pointers resolve against it."""
        self._root = schema
        return self._value(schema, 0)

    def _value(self, schema: Any, depth: int) -> Any:
        rng = self.rng
        schema = self._resolve(schema)
        if not isinstance(schema, dict) or depth > _MAX_DEPTH:
            return None
        if "const" in schema:
            value = schema["const"]
            if isinstance(value, str) and rng.random() < self.unknown_p:
                return UNKNOWN_TOOL
            return value
        if schema.get("enum"):
            return rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return self._value(rng.choice(schema[key]), depth + 1)
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return [
                self._value(schema.get("items", {}), depth + 1) for _ in range(_count(rng, schema))
            ]
        if kind == "integer":
            low, high = _bounds(schema, integer=True)
            return rng.randint(int(low), int(high))
        if kind == "number":
            low, high = _bounds(schema, integer=False)
            return min(max(round(rng.uniform(low, high), 2), low), high)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        return _string(rng, schema)

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        rng = self.rng
        props: dict[str, Any] = schema.get("properties") or {}
        required = [p for p in schema.get("required", []) if p in props]
        out = {}
        for name, sub in props.items():
            if name in required or rng.random() < 0.5:
                out[name] = self._value(sub, depth + 1)
        if props and rng.random() < self.error_p:
            subs = {name: self._resolve(sub) for name, sub in props.items()}
            droppable = [n for n in required if n in out and not _is_const(subs[n])]
            wrong = {n: _wrong_for(subs[n]) for n in out if not _is_const(subs[n])}
            retypable = [n for n, v in wrong.items() if v is not _CANNOT_BREAK]
            if droppable and (not retypable or rng.random() < 0.5):
                del out[rng.choice(droppable)]
            elif retypable:
                name = rng.choice(retypable)
                out[name] = wrong[name]
        return out

    def _resolve(self, schema: Any) -> Any:
        # Chains of refs end within a few hops in sane schemas; a cycle ends as {}.
        for _ in range(_MAX_DEPTH):
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
                return schema
            schema = _pointer(self._root, schema["$ref"])
        return {}


def _kind(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _count(rng: random.Random, schema: dict[str, Any]) -> int:
    low = max(int(schema.get("minItems", 0)), 1)
    high = max(low, 3)
    cap = schema.get("maxItems")
    if isinstance(cap, int):
        high = min(high, cap)
        low = min(low, high)
    return rng.randint(low, high)


def _bounds(schema: dict[str, Any], *, integer: bool) -> tuple[float, float]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    low = float(lo) if isinstance(lo, int | float) else None
    high = float(hi) if isinstance(hi, int | float) else None
    if integer:
        low = math.ceil(low) if low is not None else None
        high = math.floor(high) if high is not None else None
    if low is None:
        low = 0.0 if high is None or high >= 0 else high - 99
    if high is None:
        high = low + 99
    return low, max(low, high)


def _string(rng: random.Random, schema: dict[str, Any]) -> str:
    text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    most = schema.get("maxLength")
    if isinstance(most, int):
        text = text[:most]
    least = schema.get("minLength")
    if isinstance(least, int):
        text = text.ljust(least, "x")
    return text


def _is_const(schema: Any) -> bool:
    return isinstance(schema, dict) and "const" in schema


def _fits(value: Any, schema: dict[str, Any]) -> bool:
    """Whether ``value`` passes the schema's ``type`` and ``enum`` (the rest is not checked)."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind is None:
        return True
    kinds = kind if isinstance(kind, list) else [kind]
    return any(_is_type(value, k) for k in kinds)


def _is_type(value: Any, kind: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    checks: dict[Any, type | tuple[type, ...]] = {
        "string": str,
        "boolean": bool,
        "object": dict,
        "array": list,
        "null": type(None),
    }
    expected = checks.get(kind)
    return expected is None or isinstance(value, expected)


def _wrong_for(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return _CANNOT_BREAK
    return next((w for w in _WRONG if not _fits(w, schema)), _CANNOT_BREAK)


def _pointer(root: Any, ref: str) -> Any:
    """The subschema at a local ref (``#/$defs/x``); anything else reads as ``{}``."""
    if not ref.startswith("#"):
        return {}
    node = root
    for part in ref[1:].split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return {}
    return node


def json_pieces(text: str) -> list[str]:
    """Token-sized pieces of a JSON text: strings, punctuation, numbers, whitespace."""
    return _PIECE.findall(text)
