"""The project's error tree. Every layer raises these; only orchestratord maps them to HTTP.

OrchestratorError            code, message, retriable, details
├── InvalidParams            422 INVALID_PARAMS   (bad input, names the field)
├── NotFound                 404 NOT_FOUND
├── Conflict                 409 CONFLICT         (idempotency key reused, illegal transition)
├── Unsupported              501 UNSUPPORTED      (accepted by the schema, not served yet)
├── PoolUnavailable          503 POOL_UNAVAILABLE (placement found no healthy pool)
├── NoCapacity               503 NO_CAPACITY
├── EngineError              502 ENGINE_ERROR     (raised by worker adapters)
├── ToolArgsInvalid          422 TOOL_ARGS_INVALID (every schema error, with its pointer)
├── ToolError                502 TOOL_ERROR       (a tool failed: a step error)
├── CircuitOpen              503 CIRCUIT_OPEN     (a breaker is open: retriable)
├── LimitExceeded            429 LIMIT_EXCEEDED   (a configured limit, named: retriable)
│   └── TooLarge             413 LIMIT_EXCEEDED   (a size limit: the same request never fits)
├── Unauthenticated          401 UNAUTHENTICATED  (no key, or not a valid one)
├── Forbidden                403 FORBIDDEN        (the key's scope is too low)
├── DatabaseUnavailable      503 DATABASE_UNAVAILABLE (down, restarting, a connection lost:
│                                                  retriable)
├── StorageFull              507 STORAGE_FULL     (the database's disk is full: nothing new
│                                                  is stored, nothing committed is lost)
└── Cancelled                    CANCELLED
"""

from __future__ import annotations

from typing import Any


class OrchestratorError(Exception):
    code = "INTERNAL"
    retriable = False

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retriable: bool | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        if retriable is not None:
            self.retriable = retriable
        self.retry_after_ms = retry_after_ms

    def body(self) -> dict[str, Any]:
        """The contract's error body, less the correlation id that the transport adds."""
        return {
            "code": self.code,
            "message": self.message,
            "retriable": self.retriable,
            "retry_after_ms": self.retry_after_ms,
            "details": self.details,
        }


class InvalidParams(OrchestratorError):
    code = "INVALID_PARAMS"

    def __init__(self, message: str, *, field: str, **kwargs: Any) -> None:
        details = {"errors": [{"field": field, "message": message}]}
        details.update(kwargs.pop("details", {}) or {})
        super().__init__(f"{field}: {message}", details=details, **kwargs)
        self.field = field


class NotFound(OrchestratorError):
    code = "NOT_FOUND"

    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(f"{kind} {ident!r} not found", details={"kind": kind, "id": ident})


class Conflict(OrchestratorError):
    code = "CONFLICT"


class Unsupported(OrchestratorError):
    code = "UNSUPPORTED"


class PoolUnavailable(OrchestratorError):
    code = "POOL_UNAVAILABLE"
    retriable = True


class NoCapacity(OrchestratorError):
    code = "NO_CAPACITY"
    retriable = True


class EngineError(OrchestratorError):
    code = "ENGINE_ERROR"


class Cancelled(OrchestratorError):
    code = "CANCELLED"


class ToolArgsInvalid(OrchestratorError):
    """``errors`` as listed (at most ``validation.max_errors``); ``not_listed`` found beyond
    them; ``cut_short``: the deadline stopped the search (there may be more)."""

    code = "TOOL_ARGS_INVALID"

    def __init__(
        self,
        tool: str,
        errors: list[dict[str, str]],
        *,
        not_listed: int = 0,
        cut_short: bool = False,
    ) -> None:
        first = errors[0] if errors else {"pointer": "", "message": "invalid"}
        more = len(errors) - 1 + not_listed
        details: dict[str, Any] = {"tool": tool, "field": "input.args", "errors": errors}
        if not_listed or cut_short:
            details.update(errors_not_listed=not_listed, errors_cut_short=cut_short)
        super().__init__(
            f"args of tool {tool!r} do not match its schema: "
            # "/" would name the key "" (RFC 6901), not the arguments themselves
            f"{first['pointer'] or '(root)'}: {first['message']}"
            + (f" (and {'at least ' if cut_short else ''}{more} more)" if more > 0 else ""),
            details=details,
        )


class ToolError(OrchestratorError):
    code = "TOOL_ERROR"


class CircuitOpen(OrchestratorError):
    code = "CIRCUIT_OPEN"
    retriable = True

    def __init__(self, target: str, *, retry_after_ms: int) -> None:
        super().__init__(
            f"circuit {target} is open: calls fail fast for {retry_after_ms} ms",
            details={"target": target, "state": "open"},
            retry_after_ms=retry_after_ms,
        )


class LimitExceeded(OrchestratorError):
    """A configured limit refused the request; ``details.limit`` names the setting."""

    code = "LIMIT_EXCEEDED"
    retriable = True

    def __init__(self, message: str, *, limit: str, value: int, retry_after_ms: int) -> None:
        super().__init__(
            message, details={"limit": limit, "value": value}, retry_after_ms=retry_after_ms
        )


class TooLarge(LimitExceeded):
    """A size limit (body, prompt, tools of a flow, a tool's schema): retrying cannot help."""

    retriable = False

    def __init__(self, message: str, *, limit: str, value: int, field: str) -> None:
        super().__init__(message, limit=limit, value=value, retry_after_ms=0)
        self.retry_after_ms = None
        self.details["field"] = field


class Unauthenticated(OrchestratorError):
    code = "UNAUTHENTICATED"


class Forbidden(OrchestratorError):
    code = "FORBIDDEN"

    def __init__(self, message: str, *, required: str, scope: str) -> None:
        super().__init__(message, details={"required": required, "scope": scope})


class DatabaseUnavailable(OrchestratorError):
    """The database could not serve the request: down, restarting, refusing connections, or
    the connection was lost in the middle of it. Retriable: a retry with the same
    ``client_token`` never stores a write twice (the lost one may have committed)."""

    code = "DATABASE_UNAVAILABLE"
    retriable = True

    def __init__(self, reason: str, *, retry_after_ms: int = 1000) -> None:
        super().__init__(
            f"the database is unavailable ({reason}); retry after {retry_after_ms} ms, with "
            "the same client_token for a write",
            details={"reason": reason},
            retry_after_ms=retry_after_ms,
        )


class StorageFull(OrchestratorError):
    """The database's storage is full: new writes are refused until space is freed; what
    was committed before is kept. Retriable, later: an operator has to free space."""

    code = "STORAGE_FULL"
    retriable = True

    def __init__(self, *, retry_after_ms: int = 30_000) -> None:
        super().__init__(
            "the database's storage is full: nothing new is stored until space is freed "
            "(what was committed before is kept)",
            details={"reason": "storage_full"},
            retry_after_ms=retry_after_ms,
        )
