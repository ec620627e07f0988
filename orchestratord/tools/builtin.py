"""Builtin tools: small functions in this process, registered by name."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from orchestratord.tools.errors import ToolFailure

Builtin = Callable[[dict[str, Any], float | None], Awaitable[Any]]
BUILTINS: dict[str, Builtin] = {}


def register(name: str) -> Callable[[Builtin], Builtin]:
    def add(fn: Builtin) -> Builtin:
        BUILTINS[name] = fn
        return fn

    return add


def builtin_names() -> list[str]:
    return sorted(BUILTINS)


@register("echo")
async def echo(args: dict[str, Any], deadline_s: float | None) -> Any:
    """Its args, unchanged."""
    return args


@register("sleep")
async def sleep(args: dict[str, Any], deadline_s: float | None) -> Any:
    """Waits ``args.ms`` milliseconds; past the deadline it fails as a timeout."""
    ms = args.get("ms")
    if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
        raise ToolFailure("builtin", "sleep needs args.ms, an integer >= 0")
    if deadline_s is not None and ms / 1000 > deadline_s:
        await asyncio.sleep(max(0.0, deadline_s))
        raise ToolFailure("timeout", f"sleep of {ms} ms passed the deadline")
    await asyncio.sleep(ms / 1000)
    return {"slept_ms": ms}


class BuiltinExecutor:
    async def call(self, name: str, args: dict[str, Any], *, deadline_s: float | None) -> Any:
        fn = BUILTINS.get(name)
        if fn is None:
            raise ToolFailure(
                "builtin", f"no builtin tool {name!r} (there are: {', '.join(builtin_names())})"
            )
        return await fn(args, deadline_s)
