"""Canonical JSON and content hashes.

The canonical form: object keys sorted by code point, no insignificant whitespace, strings
and keys in Unicode NFC, integral floats written as integers (``1.0`` -> ``1``), NaN and
infinities refused. Equal inputs give equal bytes in any process, so their SHA-256 is a
stable identity.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from typing import Any

import orjson

from orchestrator_core.errors import InvalidParams

_MAX_EXACT_INT = 2**53
_MIN_INT, _MAX_INT = -(2**63), 2**64 - 1


def _text(value: str, path: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidParams("string is not valid Unicode (lone surrogate)", field=path) from exc
    return unicodedata.normalize("NFC", value)


def normalize(value: Any, path: str = "$") -> Any:
    """Return the canonical value tree of ``value`` (dicts, lists, str, int, float, bool, None)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, path)
    if isinstance(value, int):
        if not _MIN_INT <= value <= _MAX_INT:
            raise InvalidParams("integer outside the 64-bit range", field=path)
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise InvalidParams("NaN and infinite numbers have no canonical form", field=path)
        if value.is_integer() and abs(value) < _MAX_EXACT_INT:
            return int(value)
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidParams("object keys must be strings", field=path)
            nkey = _text(key, path)
            if nkey in out:
                raise InvalidParams(
                    f"key {key!r} is duplicated after NFC normalization", field=path
                )
            out[nkey] = normalize(item, f"{path}.{nkey}")
        return out
    if isinstance(value, (list, tuple)):
        return [normalize(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise InvalidParams(f"type {type(value).__name__} is not JSON", field=path)


def canonical_json(value: Any) -> bytes:
    return orjson.dumps(normalize(value), option=orjson.OPT_SORT_KEYS)


def sha256_of(value: Any) -> str:
    """``"sha256:<hex>"`` over the canonical JSON of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
