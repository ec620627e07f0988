"""Executors by kind, behind one call: ``ToolExecutors.call(invocation)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from orchestratord.tools.builtin import BuiltinExecutor
from orchestratord.tools.http import HttpToolExecutor, HttpToolSettings

OnRetry = Callable[[int, str], None]

__all__ = ["HttpToolSettings", "OnRetry", "ToolExecutors", "ToolInvocation"]


@dataclass(frozen=True)
class ToolInvocation:
    tool: str
    args: dict[str, Any]
    executor: dict[str, Any]  # the flow's executor spec, as stored
    deadline_s: float | None  # seconds left of the step's wall budget, retries included
    request_id: str  # the step id: the ``Idempotency-Key`` of an HTTP call


class Executor(Protocol):
    async def call(self, inv: ToolInvocation, *, on_retry: OnRetry | None) -> Any: ...

    def target_of(self, inv: ToolInvocation) -> str: ...

    async def aclose(self) -> None: ...


class _Http:
    def __init__(self, settings: HttpToolSettings) -> None:
        self.inner = HttpToolExecutor(settings)

    async def call(self, inv: ToolInvocation, *, on_retry: OnRetry | None) -> Any:
        spec = inv.executor
        return await self.inner.post(
            spec["url"],
            inv.args,
            timeout_ms=spec.get("timeout_ms"),
            deadline_s=inv.deadline_s,
            idempotent=bool(spec.get("idempotent")),
            max_retries=spec.get("max_retries"),
            max_reply_bytes=spec.get("max_reply_bytes"),
            idempotency_key=inv.request_id,
            on_retry=on_retry,
        )

    def target_of(self, inv: ToolInvocation) -> str:
        raw = inv.executor["url"]
        try:
            url = urlsplit(raw)
            port = url.port or (443 if url.scheme == "https" else 80)
        except ValueError:  # a bad port or IPv6 literal: the call fails, its breaker still counts
            return f"http:{raw.split('?', 1)[0]}"
        host = url.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        return f"http:{url.scheme}://{host}:{port}{url.path or '/'}"

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Builtin:
    def __init__(self) -> None:
        self.inner = BuiltinExecutor()

    async def call(self, inv: ToolInvocation, *, on_retry: OnRetry | None) -> Any:
        return await self.inner.call(inv.executor["name"], inv.args, deadline_s=inv.deadline_s)

    def target_of(self, inv: ToolInvocation) -> str:
        return f"builtin:{inv.executor['name']}"

    async def aclose(self) -> None:
        return None


class ToolExecutors:
    """One executor per kind, shared by every call (one pooled HTTP client)."""

    def __init__(self, settings: HttpToolSettings | None = None) -> None:
        self._by_kind: dict[str, Executor] = {
            "http": _Http(settings or HttpToolSettings()),
            "builtin": _Builtin(),
        }

    def _of(self, inv: ToolInvocation) -> Executor:
        kind = inv.executor.get("kind")
        executor = self._by_kind.get(kind) if isinstance(kind, str) else None
        if executor is None:  # the flow contract admits only known kinds: a broken row
            raise ValueError(f"tool {inv.tool!r} has an executor of unknown kind {kind!r}")
        return executor

    async def call(self, inv: ToolInvocation, *, on_retry: OnRetry | None = None) -> Any:
        return await self._of(inv).call(inv, on_retry=on_retry)

    def target_of(self, inv: ToolInvocation) -> str:
        """The circuit breaker's key: one endpoint, or one builtin."""
        return self._of(inv).target_of(inv)

    async def aclose(self) -> None:
        for executor in self._by_kind.values():
            await executor.aclose()
