"""Path and query parameters hold no NUL: every route's ids and filters end up compared in
SQL, and PostgreSQL refuses NUL in text (``contracts.bounds``). One app-wide dependency
checks them all, before the route runs, and names the parameter."""

from __future__ import annotations

from fastapi import Request

from orchestrator_core.errors import InvalidParams


async def refuse_nul(request: Request) -> None:
    for name, value in request.path_params.items():
        if isinstance(value, str) and "\x00" in value:
            raise InvalidParams("must not contain NUL (\\u0000)", field=f"path.{name}")
    for name, value in request.query_params.multi_items():
        if "\x00" in value or "\x00" in name:
            raise InvalidParams("must not contain NUL (\\u0000)", field=f"query.{name}")
