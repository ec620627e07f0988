"""What a request may carry, so that whatever the API accepts can be stored, hashed, encoded
and read back on every backend. Past a bound, a request is 422 ``INVALID_PARAMS`` naming the
field; nothing is stored.

- **Integers** the API takes as counts, sizes, durations and cursors lie in ``0..MAX_INT``
  (2**53 - 1): every JSON reader holds them exactly, and sums of a few of them still fit
  the 64-bit columns they meet in SQL. (``seed`` keeps its own 0..2**63 - 1.)
- **Floats** are finite: JSON has no NaN or Infinity, and the databases refuse them.
  ``max_cost_usd`` is at most ``MAX_COST_USD``.
- **Every value** of a request (free-form JSON included: a flow's ast, fact data, checkpoint
  state, tool arguments) nests at most ``MAX_JSON_DEPTH`` levels, because hashing, event
  encoding and JSON Schema validation recurse; its integers fit 64 bits (the encoder's
  range, -2**63..2**64 - 1) and its strings hold no lone surrogate (no UTF-8 form).
- **JSON null** is refused where a value is required (``RequiredJson``): a flow's ``ast``,
  a fact's ``data``.
- **Text** stored in a text column or compared in a query (ids, client tokens, fact types,
  paths) holds no NUL, which PostgreSQL refuses in text. Path and query parameters follow
  the same rule (``orchestratord.api.params``). NUL inside JSON values is kept: the JSON
  columns are ``json``, which stores the ``\\u0000`` escape as written (``jsonb`` would
  refuse it), so such values read back unchanged.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

MAX_INT = 2**53 - 1
MAX_COST_USD = 1e9
MAX_TOP_K = 2**31 - 1  # engines take top_k as a 32-bit integer
MAX_JSON_DEPTH = 64
_MIN_JSON_INT, _MAX_JSON_INT = -(2**63), 2**64 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHOWN_KEY = 40  # characters of a key shown in a field path
UNSTORABLE = "unstorable_value"  # the validation error type of ``check_storable``

# ``(parent, key)`` links from a value up to the field, rendered only for an error.
_Where = tuple[Any, str | int] | None


def _path(where: _Where) -> str:
    """``.key`` and ``[index]`` steps from the field to the value (``canonical``'s style)."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            shown = key if len(key) <= _SHOWN_KEY else key[:_SHOWN_KEY] + "..."
            parts.append(f".{shown}")
    return "".join(reversed(parts))


def _lone_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def unfit(value: Any, max_depth: int = MAX_JSON_DEPTH) -> tuple[str, str] | None:
    """Why ``value`` (a validated field value) could not be stored and read back, and where
    in it (``""``: the value itself; ``.a[2]``: below it); None when it can.

    Iterative, since the depth is what it checks. Models inside are skipped: their own
    fields were checked when they were validated.
    """
    stack: list[tuple[Any, int, _Where]] = [(value, 0, None)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            if _lone_surrogate(item):
                return "a lone surrogate, which has no UTF-8 form", _path(where)
        elif item is None or isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if not _MIN_JSON_INT <= item <= _MAX_JSON_INT:
                return "integer outside the 64-bit range", _path(where)
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "NaN and infinite numbers are not JSON", _path(where)
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                return f"nested deeper than {max_depth} levels", ""
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str) and _lone_surrogate(key):
                        return "a key holds a lone surrogate, which has no UTF-8 form", _path(where)
                    stack.append((child, depth + 1, (where, key)))
            else:
                stack.extend((child, depth + 1, (where, i)) for i, child in enumerate(item))
    return None


def check_storable(value: Any, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``value``, or the validation error saying why it cannot be stored; the error's
    ``ctx.at`` is where below the field (the API appends it to the field's path)."""
    found = unfit(value, max_depth)
    if found is not None:
        problem, at = found
        raise PydanticCustomError(UNSTORABLE, "{problem}", {"problem": problem, "at": at})
    return value


def nul_free(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("nul_character", "must not contain NUL (\\u0000)")
    return value


def _required(value: Any) -> Any:
    if value is None:
        raise PydanticCustomError("null_value", "must not be null")
    return value


Text = Annotated[str, AfterValidator(nul_free)]
"""A string stored as text or compared in a query: no NUL."""

RetryToken = Annotated[
    Text | None,
    Field(
        min_length=1,
        max_length=256,
        description="a retried request with the same token answers the first record (200); "
        "the same token with another body is 409 CONFLICT",
    ),
]
"""An optional ``client_token`` of a write a client may retry."""

RequiredJson = Annotated[
    Any, AfterValidator(_required), Field(json_schema_extra={"not": {"type": "null"}})
]
"""Any JSON value but null (stored in a NOT NULL column)."""

Count = Annotated[int, Field(ge=0, le=MAX_INT)]
"""A count, size or duration: 0..2**53 - 1."""
