"""The OpenAPI document as the server really answers.

FastAPI describes the success responses; this adds what every route may also answer: the
one error body (``ErrorBody``) for each status the HTTP layer produces, in place of
FastAPI's own validation-error schema, and the bearer-key security with each route's scope
(``x-scope``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from contracts.common import ErrorBody
from orchestratord.api.auth import api_routes, declared_scope

SCHEME = "apiKey"
_ERROR = {"$ref": "#/components/schemas/ErrorBody"}
_WHY = {
    "400": "malformed JSON",
    "401": "UNAUTHENTICATED: no valid API key (auth is on)",
    "403": "FORBIDDEN (the key's scope is too low) or POLICY_DENIED",
    "404": "NOT_FOUND",
    "409": "CONFLICT, BUDGET_EXCEEDED, RUN_ENDED, STRICT_REPLAY_MISMATCH, ...",
    "413": "LIMIT_EXCEEDED: a size limit (body, prompt, tools of a flow)",
    "422": "INVALID_PARAMS naming each field, or a domain refusal of the input",
    "429": "LIMIT_EXCEEDED or admission: retriable, with retry_after_ms",
    "431": "LIMIT_EXCEEDED: too many request headers, or too many bytes of them",
    "500": "INTERNAL: the correlation id locates it in the logs",
    "501": "UNSUPPORTED",
    "502": "ENGINE_ERROR or TOOL_ERROR",
    "503": "POOL_UNAVAILABLE, NO_CAPACITY, CIRCUIT_OPEN or DATABASE_UNAVAILABLE: retriable",
    "507": "STORAGE_FULL: the database's disk is full; retriable once space is freed",
}
_EVERY = ("401", "403", "422", "429", "431", "500", "503")
_WITH_BODY = ("400", "409", "413")
_SUBMIT = ("501", "502")  # steps and runs: placement, engines


def _statuses(method: str, path: str) -> tuple[str, ...]:
    statuses = list(_EVERY)
    if "{" in path:
        statuses.append("404")
    if method in ("post", "put", "patch"):
        statuses += (*_WITH_BODY, "507")
        if path.endswith(("/steps", "/runs", "/provision")):  # engines met: 502, 503
            statuses += _SUBMIT
    if method == "delete":
        statuses.append("409")  # what is in use is not deleted
    return tuple(statuses)


def describe(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        routes=app.routes,
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    _, defs = models_json_schema(
        [(ErrorBody, "serialization")], ref_template="#/components/schemas/{model}"
    )
    schemas.update(defs.get("$defs", {}))
    components["securitySchemes"] = {
        SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "Authorization: Bearer ok_<key id>_<secret>; required once any key "
            "exists or the server runs with --auth",
        }
    }
    scopes = {}
    for route in api_routes(app.routes):
        for method in route.methods or ():
            scopes[(method.lower(), route.path_format)] = declared_scope(route)
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            scope = scopes.get((method, path))
            responses = op.setdefault("responses", {})
            if scope is None:
                op["security"] = []
                continue
            op["security"] = [{SCHEME: []}]
            op["x-scope"] = scope.label
            for status in _statuses(method, path):
                if status == "422" and "422" not in responses and not _takes_input(op):
                    continue
                responses[status] = {
                    "description": responses.get(status, {}).get("description") or _WHY[status],
                    "content": {"application/json": {"schema": _ERROR}},
                }
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    app.openapi_schema = doc
    return doc


def _takes_input(op: dict[str, Any]) -> bool:
    return bool(op.get("parameters") or op.get("requestBody"))


def install(app: FastAPI) -> None:
    app.openapi = lambda: describe(app)  # type: ignore[method-assign]
