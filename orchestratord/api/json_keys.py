"""A JSON body whose object repeats a key is refused (400, naming the key and where), not
read with the last value winning as JSON parsers do.

The check costs little on the usual body: a scan of its keys (a regular expression) finds
none repeated and the body is not parsed again. Only a body naming one key twice anywhere
(``role`` in each of several chat messages, say) is parsed once more, with every object's
keys compared (``json.loads``' ``object_pairs_hook``)."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request

from orchestrator_core.errors import InvalidParams

# a JSON string followed by a colon: an object's key (or a string value ending in ':' inside
# another string's escape: a false alarm only costs the precise check)
_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:')


class DuplicateKey(InvalidParams):
    """A body's object names a key twice (answered 400, as malformed JSON is)."""


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
    except ValueError:
        return None
    return None


def refuse(body: bytes) -> None:
    key = duplicate_key(body)
    if key is not None:
        raise DuplicateKey(f"an object names the key {key!r} twice", field=f"body.{key}")


async def refuse_duplicate_keys(request: Request) -> None:
    """Every route's: a JSON body's objects name each key once."""
    if request.method in ("GET", "HEAD", "DELETE", "OPTIONS"):
        return
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type and content_type != "application/json":
        return
    refuse(await request.body())
