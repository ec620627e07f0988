"""One error body everywhere: the domain's errors, bad input, unknown routes, crashes."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.error_fields import field_of
from orchestrator_core import errors as E
from orchestrator_core.admission import AdmissionReject, QueueFullDropLru
from orchestrator_core.budgets import BudgetExceeded
from orchestrator_core.gates import GateExprInvalid
from orchestrator_core.policy import PolicyDenied
from orchestrator_core.pricing import Unpriced
from orchestrator_core.replay import StrictReplayMismatch
from orchestratord.api.correlation import correlation_id
from orchestratord.api.json_keys import DuplicateKey
from orchestratord.api.responses import JsonResponse
from orchestratord.db.outage import unavailable

log = logging.getLogger("orchestratord.api")

STATUS: dict[type[E.OrchestratorError], int] = {
    DuplicateKey: 400,
    BudgetExceeded: 409,
    StrictReplayMismatch: 409,
    Unpriced: 422,
    PolicyDenied: 403,
    AdmissionReject: 429,
    QueueFullDropLru: 429,
    E.InvalidParams: 422,
    E.NotFound: 404,
    E.Conflict: 409,
    E.Unsupported: 501,
    E.PoolUnavailable: 503,
    E.NoCapacity: 503,
    E.EngineError: 502,
    E.ToolArgsInvalid: 422,
    E.ToolError: 502,
    E.CircuitOpen: 503,
    E.LimitExceeded: 429,
    E.TooLarge: 413,
    E.Unauthenticated: 401,
    E.Forbidden: 403,
    GateExprInvalid: 422,
    E.Cancelled: 409,
    E.DatabaseUnavailable: 503,
    E.StorageFull: 507,
}
# refused before anything ran: counted by code on /metrics
REFUSALS = (
    BudgetExceeded,
    PolicyDenied,
    AdmissionReject,
    QueueFullDropLru,
    Unpriced,
    E.PoolUnavailable,
    E.NoCapacity,
    E.CircuitOpen,
    E.LimitExceeded,
    E.Unauthenticated,
    E.Forbidden,
    E.DatabaseUnavailable,
    E.StorageFull,
)
_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 400: "INVALID_PARAMS"}


def error_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> JsonResponse:
    body = {**body, "correlation_id": correlation_id.get()}
    if body.get("retry_after_ms") and headers is None:
        headers = {"Retry-After": str(max(1, round(body["retry_after_ms"] / 1000)))}
    return JsonResponse(body, status_code=status, headers=headers)


def status_of(exc: E.OrchestratorError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


async def on_domain_error(request: Request, exc: Exception) -> JsonResponse:
    assert isinstance(exc, E.OrchestratorError)
    if isinstance(exc, REFUSALS):
        orch = getattr(request.app.state, "orchestrator", None)
        if orch is not None:
            orch.metrics.refusals.labels(exc.code).inc()
    if isinstance(exc, E.DatabaseUnavailable | E.StorageFull):
        # one line, no traceback: an outage answers every request so until it is over
        cause = exc.__cause__
        log.warning(
            "%s %s: %s: %s%s",
            request.method,
            request.url.path,
            exc.code,
            exc.details.get("reason"),
            f" ({type(cause).__name__})" if cause is not None else "",
        )
    return error_response(status_of(exc), exc.body())


async def on_database_error(request: Request, exc: Exception) -> JsonResponse:
    """A driver's error that reached the API: the contract's retriable answer when it says
    the database cannot serve (``db/outage.py``); any other is a crash, answered 500 by the
    correlation middleware with its traceback logged."""
    outage = unavailable(exc)
    if outage is None:
        raise exc
    if outage.__cause__ is None:
        outage.__cause__ = exc
    return await on_domain_error(request, outage)


async def on_validation_error(_request: Request, exc: Exception) -> JsonResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        msg = (
            next(e for e in errors if e.get("type") == "json_invalid")
            .get("ctx", {})
            .get("error", "malformed JSON")
        )
        return error_response(400, E.InvalidParams(f"malformed JSON: {msg}", field="body").body())
    fields = [{"field": field_of(e), "message": e["msg"]} for e in errors]
    first = fields[0] if fields else {"field": "body", "message": "invalid"}
    return error_response(
        422,
        {
            "code": "INVALID_PARAMS",
            "message": f"{first['field']}: {first['message']}",
            "retriable": False,
            "retry_after_ms": None,
            "details": {"errors": fields},
        },
    )


async def on_http_error(_request: Request, exc: Exception) -> JsonResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(
        exc.status_code, "INTERNAL" if exc.status_code >= 500 else "INVALID_PARAMS"
    )
    details: dict[str, Any] = {}
    if exc.status_code == 400:  # a body FastAPI could not parse (nested past the parser...)
        details = {"errors": [{"field": "body", "message": str(exc.detail)}]}
    return error_response(
        exc.status_code,
        {
            "code": code,
            "message": str(exc.detail),
            "retriable": False,
            "retry_after_ms": None,
            "details": details,
        },
        headers=dict(exc.headers) if exc.headers else None,
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(E.OrchestratorError, on_domain_error)
    app.add_exception_handler(DBAPIError, on_database_error)
    app.add_exception_handler(sqlite3.Error, on_database_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
