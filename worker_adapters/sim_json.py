"""JSON for a JSON Schema, deterministic per seed: the sim engine's "constrained decoding".

It follows the schema (objects, arrays, strings, numbers, booleans, null, ``enum``,
``const``, ``anyOf`` / ``oneOf``, ``required``, ``minItems`` / ``maxItems``, ``minimum`` /
``maximum``), but imperfectly on purpose, so clients see what a real model can do:

- with probability ``error_p`` (default 0.2) an object breaks its schema: one required
  property is dropped, or one value gets the wrong type;
- with probability ``unknown_p`` (default 0.05) a string ``const`` is replaced by
  ``"unknown_tool"`` (in a plan: a call of a tool that does not exist).

A ``const`` is never given a wrong type, so a plan's call keeps naming a tool.
"""

from __future__ import annotations

import random
import re
from typing import Any

_WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "signal", "prime")
_PIECE = re.compile(r'"(?:[^"\\]|\\.)*"|\s+|[{}\[\],:]|[^\s{}\[\],:"]+')
_WRONG: dict[str, Any] = {"string": 7, "integer": "seven", "number": "seven", "boolean": "no"}


class SchemaSampler:
    def __init__(self, rng: random.Random, *, error_p: float = 0.2, unknown_p: float = 0.05):
        self.rng = rng
        self.error_p = error_p
        self.unknown_p = unknown_p

    def sample(self, schema: Any, depth: int = 0) -> Any:
        rng = self.rng
        if not isinstance(schema, dict) or depth > 8:
            return None
        if "const" in schema:
            value = schema["const"]
            if isinstance(value, str) and rng.random() < self.unknown_p:
                return "unknown_tool"
            return value
        if schema.get("enum"):
            return rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return self.sample(rng.choice(schema[key]), depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "string"
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            least = int(schema.get("minItems", 1))
            most = max(least, min(int(schema.get("maxItems", 3)), 3))
            return [
                self.sample(schema.get("items", {}), depth + 1)
                for _ in range(rng.randint(least, most))
            ]
        if kind == "integer":
            return rng.randint(int(schema.get("minimum", 0)), int(schema.get("maximum", 99)))
        if kind == "number":
            low, high = float(schema.get("minimum", 0)), float(schema.get("maximum", 100))
            return round(rng.uniform(low, high), 2)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        rng = self.rng
        props: dict[str, Any] = schema.get("properties", {})
        required = [p for p in schema.get("required", []) if p in props]
        out = {}
        for name, sub in props.items():
            if name in required or rng.random() < 0.5:
                out[name] = self.sample(sub, depth + 1)
        if props and rng.random() < self.error_p:
            breakable = [n for n in out if "const" not in props[n]]
            if required and (not breakable or rng.random() < 0.5):
                out.pop(rng.choice(required), None)
            elif breakable:
                name = rng.choice(breakable)
                kind = props[name].get("type") if isinstance(props[name], dict) else None
                out[name] = _WRONG.get(kind if isinstance(kind, str) else "", "wrong")
        return out


def json_pieces(text: str) -> list[str]:
    """Token-sized pieces of a JSON text: strings, punctuation, numbers, whitespace."""
    return _PIECE.findall(text)
