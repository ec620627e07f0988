"""How JSON columns are written and read: orjson, with the standard library where it refuses.

SQLAlchemy's ``JSON`` type encodes with ``json.dumps`` unless told otherwise; on a step's
submission that was the costliest part of binding its row. orjson writes compact JSON and
refuses what JSON cannot hold exactly (integers past 64 bits, NaN): those values go through
``json.dumps`` as before, and ``loads`` reads back both.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS  # {1: "a"} -> {"1": "a"}, as json.dumps writes it


def dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, option=_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError: a huge integer, a non-finite float
        return json.dumps(value)


def loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # NaN, Infinity: what json.dumps writes and orjson refuses
        return json.loads(text)
