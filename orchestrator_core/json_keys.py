"""A JSON document whose object repeats a key is refused (naming the key and where), not read
with the last value winning as JSON parsers do. Both front doors use it: HTTP bodies
(``orchestratord/api/json_keys.py``) and the Evergreen session's ``x-run``.

The check costs little on the usual document: a scan of its keys (a regular expression) finds
none repeated and the document is not parsed again. Only one naming a key twice anywhere
(``role`` in each of several chat messages, say) is parsed once more, with every object's
keys compared (``json.loads``' ``object_pairs_hook``)."""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator_core.errors import InvalidParams

# a JSON string followed by a colon: an object's key (or a string value ending in ':' inside
# another string's escape: a false alarm only costs the precise check)
_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:')


class DuplicateKey(InvalidParams):
    """A document's object names a key twice (answered as malformed JSON is)."""


class _Found(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Found(key)
        seen.add(key)
    return dict(pairs)


def duplicate_key(body: bytes) -> str | None:
    """The first key some object of ``body`` names twice; None when none does (or when the
    body is not JSON: its parser says so)."""
    keys = _KEY.findall(body)
    if len(keys) == len(set(keys)):
        return None
    try:
        json.loads(body, object_pairs_hook=_pairs)
    except _Found as found:
        return found.key
    except (ValueError, RecursionError):
        return None
    return None


def refuse(body: bytes, where: str = "body") -> None:
    """Raises :class:`DuplicateKey` naming ``where.<key>`` when an object of ``body`` names a
    key twice."""
    key = duplicate_key(body)
    if key is not None:
        raise DuplicateKey(f"an object names the key {key!r} twice", field=f"{where}.{key}")
