"""What the client raises: every failure is a :class:`ClientError` with ``code``,
``retriable`` and ``details``.

:class:`ApiError` is the server's error body (CONTRACT.md); its subclass is chosen by the
body's ``code`` (then by the HTTP status), so an interpreter can ``except NotFound`` or
``except Unavailable`` without reading strings. :class:`Unreachable` is no answer at all.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
from pydantic import ValidationError

JsonObject = dict[str, Any]


class ClientError(Exception):
    """Anything that kept a request from getting a successful answer."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retriable: bool = False,
        details: JsonObject | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retriable = retriable
        self.details: JsonObject = details or {}

    @property
    def fields(self) -> list[str]:
        """The request fields the error names (``details.field``, ``details.errors[].field``),
        e.g. ``["input.params.max_tokens"]``."""
        named = [self.details.get("field")]
        errors = self.details.get("errors")
        if isinstance(errors, list):
            named += [e.get("field") for e in errors if isinstance(e, dict)]
        return [f for f in named if isinstance(f, str)]

    @property
    def field(self) -> str | None:
        """The first field the error names, when it names one."""
        return next(iter(self.fields), None)


class ApiError(ClientError):
    """The server answered with an error; ``body`` is its error body."""

    def __init__(
        self, status: int, body: JsonObject, *, retry_after_s: float | None = None
    ) -> None:
        details = body.get("details")
        super().__init__(
            str(body.get("code") or f"HTTP_{status}"),
            str(body.get("message", "")),
            retriable=bool(body.get("retriable")),
            details=details if isinstance(details, dict) else {},
        )
        self.status = status
        self.body = body
        wait_ms = body.get("retry_after_ms")
        if retry_after_s is None and isinstance(wait_ms, int | float) and wait_ms >= 0:
            retry_after_s = wait_ms / 1000
        self.retry_after_s: float | None = retry_after_s
        """How long the server asked to wait before a retry (``Retry-After`` or the body's
        ``retry_after_ms``); None when it did not say."""

    @property
    def correlation_id(self) -> str | None:
        value = self.body.get("correlation_id")
        return value if isinstance(value, str) else None

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "code" not in body:
            text = response.text.strip()[:500] or response.reason_phrase
            body = {
                "code": f"HTTP_{response.status_code}",
                "message": text,
                "retriable": response.status_code in (429, 502, 503, 504),
                "details": {},
            }
        body.setdefault("correlation_id", response.headers.get("x-correlation-id"))
        kind = _BY_CODE.get(str(body["code"])) or _BY_STATUS.get(response.status_code, cls)
        return kind(response.status_code, body, retry_after_s=_retry_after(response))


class BadRequest(ApiError):
    """400: malformed JSON, a repeated key, or a request the server could not read."""


class Invalid(ClientError):
    """A request with a wrong field (``field``, ``fields``, ``details.errors``): refused by
    the server (:class:`InvalidParams`) or before it was sent (:class:`InvalidRequest`)."""


class InvalidParams(ApiError, Invalid):
    """422: the server refused a field of the request."""


class InvalidRequest(Invalid):
    """The SDK refused the request before sending it: a field breaks the contract's model.
    ``details.errors`` names each field as the server would (``input.params.max_tokens``)."""

    def __init__(self, errors: list[JsonObject]) -> None:
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        super().__init__(
            "INVALID_PARAMS",
            f"{first['field']}: {first['message']}",
            details={"errors": errors},
        )

    @classmethod
    def of(cls, exc: ValidationError, *, tagged: bool = False) -> InvalidRequest:
        """From pydantic's error; ``tagged``: the first location is a union's tag (the step
        type), which the wire does not have."""
        errors = []
        for e in exc.errors(include_url=False):
            loc = e["loc"][1:] if tagged and e["loc"] else e["loc"]
            errors.append({"field": ".".join(map(str, loc)) or "body", "message": e["msg"]})
        return cls(errors)


class Unauthenticated(ApiError):
    """401: no valid API key."""


class Forbidden(ApiError):
    """403: the key's scope is too low."""


class PolicyDenied(Forbidden):
    """403 ``POLICY_DENIED``: a policy rule (``details.rule``) refused the step."""


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: the state does not allow it (``CONFLICT``, ``RUN_ENDED``, a reused token)."""


class BudgetExceeded(Conflict):
    """409 ``BUDGET_EXCEEDED``."""


class ReplayMismatch(Conflict):
    """A replay could not reproduce the record (``STRICT_REPLAY_MISMATCH``, ``REPLAY_MISS``,
    ``REPLAY_DIVERGED``)."""


class TooLarge(ApiError):
    """413 or 431: a size limit."""


class RateLimited(ApiError):
    """429: admission or a rate limit; retriable after ``retry_after_s``."""


class Unavailable(ApiError):
    """503 (``POOL_UNAVAILABLE``, ``NO_CAPACITY``, ``CIRCUIT_OPEN``,
    ``DATABASE_UNAVAILABLE``) or 507 (``STORAGE_FULL``): retriable."""


class UpstreamError(ApiError):
    """502: an engine or a tool failed (``ENGINE_ERROR``, ``TOOL_ERROR``)."""


class ServerError(ApiError):
    """500 ``INTERNAL``: ``correlation_id`` locates it in the server's logs."""


class Unreachable(ClientError):
    """No answer: connection refused, reset or timed out, or a stream that kept dropping."""

    def __init__(self, message: str) -> None:
        super().__init__("UNREACHABLE", message, retriable=True)


class StepFailed(ClientError):
    """A step followed to its end ended with an ``error`` event; ``step_id`` names it and
    ``body`` is the event (the contract's error body)."""

    def __init__(self, step_id: str, body: JsonObject) -> None:
        details = body.get("details")
        super().__init__(
            str(body.get("code", "ERROR")),
            f"step {step_id}: {body.get('message', '')}",
            retriable=bool(body.get("retriable")),
            details=details if isinstance(details, dict) else {},
        )
        self.step_id = step_id
        self.body = body


_BY_CODE: dict[str, type[ApiError]] = {
    "INVALID_PARAMS": InvalidParams,
    "TOOL_ARGS_INVALID": InvalidParams,
    "GATE_EXPR_INVALID": InvalidParams,
    "UNAUTHENTICATED": Unauthenticated,
    "FORBIDDEN": Forbidden,
    "POLICY_DENIED": PolicyDenied,
    "NOT_FOUND": NotFound,
    "CONFLICT": Conflict,
    "RUN_ENDED": Conflict,
    "BUDGET_EXCEEDED": BudgetExceeded,
    "STRICT_REPLAY_MISMATCH": ReplayMismatch,
    "REPLAY_MISS": ReplayMismatch,
    "REPLAY_DIVERGED": ReplayMismatch,
    "POOL_UNAVAILABLE": Unavailable,
    "NO_CAPACITY": Unavailable,
    "CIRCUIT_OPEN": Unavailable,
    "DATABASE_UNAVAILABLE": Unavailable,
    "STORAGE_FULL": Unavailable,
    "ENGINE_ERROR": UpstreamError,
    "TOOL_ERROR": UpstreamError,
    "INTERNAL": ServerError,
}
_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: InvalidParams,
    429: RateLimited,
    431: TooLarge,
    500: ServerError,
    502: UpstreamError,
    503: Unavailable,
    507: Unavailable,
}


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (the delta-seconds form; an HTTP date is not used here)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
