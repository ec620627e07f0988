"""A JSON body whose object repeats a key is refused (400, naming the key and where): the
check itself is ``orchestrator_core.json_keys``, shared with the Evergreen door's ``x-run``."""

from __future__ import annotations

from fastapi import Request

from orchestrator_core.json_keys import DuplicateKey, duplicate_key, refuse

__all__ = ["DuplicateKey", "duplicate_key", "refuse", "refuse_duplicate_keys"]


async def refuse_duplicate_keys(request: Request) -> None:
    """Every route's: a JSON body's objects name each key once."""
    if request.method in ("GET", "HEAD", "DELETE", "OPTIONS"):
        return
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type and content_type != "application/json":
        return
    refuse(await request.body())
