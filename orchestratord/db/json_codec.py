"""How JSON columns are written and read: orjson, with the standard library where it refuses.

SQLAlchemy's ``JSON`` type encodes with ``json.dumps`` unless told otherwise; on a step's
submission that was the costliest part of binding its row. orjson writes compact JSON, but it
refuses integers past 64 bits and writes a non-finite float as ``null``: a value it refuses,
or one holding a NaN or an infinity, is written by ``json.dumps`` as before (NaN as ``NaN``,
which PostgreSQL refuses and SQLite keeps), so nothing stored changes meaning. ``loads``
reads back both.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS  # {1: "a"} -> {"1": "a"}, as json.dumps writes it


def dumps(value: Any) -> str:
    try:
        text = orjson.dumps(value, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits
        return _standard(value)
    if b"null" in text and _non_finite(value):  # a NaN/Infinity orjson turned into null
        return _standard(value)
    return text.decode()


def _non_finite(value: Any) -> bool:
    """A NaN or an infinity anywhere in the value (keys included). Looked for only when the
    text holds a ``null``: most rows hold one (a ``None``), and this walk costs less than
    encoding them again."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.values())
            stack.extend(v.keys())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return False


def _standard(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # NaN, Infinity: what json.dumps writes and orjson refuses
        return json.loads(text)
