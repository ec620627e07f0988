"""The service's error codes as gRPC statuses, for a session that aborts.

An error the service answers over HTTP with a JSON body aborts an Evergreen session with the
status below; the same body (``code``, ``message``, ``retriable``, ``details``) goes in the
trailing metadata ``x-error``. Codes not listed map by retriability: a retriable one is
``UNAVAILABLE`` (try again), any other ``INTERNAL``.
"""

from __future__ import annotations

import grpc  # type: ignore[import-untyped]

BY_CODE: dict[str, grpc.StatusCode] = {
    "INVALID_PARAMS": grpc.StatusCode.INVALID_ARGUMENT,
    "TOOL_ARGS_INVALID": grpc.StatusCode.INVALID_ARGUMENT,
    "GATE_EXPR_INVALID": grpc.StatusCode.INVALID_ARGUMENT,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "CONFLICT": grpc.StatusCode.ABORTED,
    "UNSUPPORTED": grpc.StatusCode.UNIMPLEMENTED,
    "UNAUTHENTICATED": grpc.StatusCode.UNAUTHENTICATED,
    "FORBIDDEN": grpc.StatusCode.PERMISSION_DENIED,
    "POLICY_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "FS_POLICY_VIOLATION": grpc.StatusCode.PERMISSION_DENIED,
    "BUDGET_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "LIMIT_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "ADMISSION_REJECT": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "QUEUE_FULL_DROP_LRU": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "CANCELLED": grpc.StatusCode.CANCELLED,
    "RUN_ENDED": grpc.StatusCode.FAILED_PRECONDITION,
    "STRICT_REPLAY_MISMATCH": grpc.StatusCode.FAILED_PRECONDITION,
    "REPLAY_MISS": grpc.StatusCode.FAILED_PRECONDITION,
    "PRICE_UNKNOWN": grpc.StatusCode.FAILED_PRECONDITION,
}


def status_for(code: str, *, retriable: bool) -> grpc.StatusCode:
    """The gRPC status of an error ``code`` (``ENGINE_ERROR``, ``TOOL_ERROR`` and the rest by
    ``retriable``)."""
    found = BY_CODE.get(code)
    if found is not None:
        return found
    return grpc.StatusCode.UNAVAILABLE if retriable else grpc.StatusCode.INTERNAL


def named_status(name: str) -> grpc.StatusCode:
    """A status by its name (``"INVALID_ARGUMENT"``), as the node store names them."""
    return grpc.StatusCode[name]
