"""Every route declares its scope; a key proves it.

Routes carry one of ``READ``, ``WRITE`` or ``ADMIN`` in their ``dependencies``. The
``AuthMiddleware`` (pure ASGI, so it answers before any body is read) finds the route's
scope, checks the ``Authorization: Bearer`` key and counts the request against the key's
rate. A path no route serves needs ``read``. ``/healthz`` (and ``/metrics`` while
``auth.open_metrics``) answer without a key, and so does every :class:`OpenRoute`: the
dashboard's page shells and the static assets of it and of the API docs, which hold no data
(the pages read it from the API, with the key they ask for). With auth off the middleware
costs one cached check.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Depends, Request
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator_core import keys
from orchestrator_core.errors import Forbidden, InvalidParams, OrchestratorError, Unauthenticated
from orchestrator_core.keys import Principal
from orchestrator_core.secrets import secret_param
from orchestratord.api.asgi import header
from orchestratord.api.errors import error_response, status_of
from orchestratord.db.outage import unavailable

PRINCIPAL = "orchestratord.principal"


def authorize(scope: Scope, guard: Any, required: keys.Scope) -> Principal | None:
    """The request's principal (None while auth is off), allowed ``required``; the middleware
    checked its key. ``guard`` is the orchestrator's ``auth``."""
    principal: Principal | None = scope.get(PRINCIPAL)
    if principal is None:
        if guard.on and scope["path"] not in guard.open_paths:
            raise Unauthenticated("no valid API key: send Authorization: Bearer <key>")
        return None
    if not principal.allows(required):
        raise _forbidden(principal, required)
    return principal


def _requires(scope: keys.Scope) -> Callable[[Request], Awaitable[Principal | None]]:
    async def check(request: Request) -> Principal | None:
        return authorize(request.scope, request.app.state.orchestrator.auth, scope)

    check.scope = scope  # type: ignore[attr-defined]
    return check


READ: Any = Depends(_requires(keys.Scope.READ))
WRITE: Any = Depends(_requires(keys.Scope.WRITE))
ADMIN: Any = Depends(_requires(keys.Scope.ADMIN))


def principal_of(request: Request) -> Principal | None:
    principal: Principal | None = request.scope.get(PRINCIPAL)
    return principal


def api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    """Every ``APIRoute``, also inside included routers (newer FastAPI keeps them nested;
    the routers here are included without a prefix)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif (inner := getattr(route, "original_router", None)) is not None:
            yield from api_routes(inner.routes)


def declared_scope(route: APIRoute) -> keys.Scope | None:
    """The scope a route declares in its dependencies, if it declares one."""
    found = [
        getattr(d.call, "scope")  # noqa: B009 (a function attribute mypy does not know)
        for d in route.dependant.dependencies
        if hasattr(d.call, "scope")
    ]
    return found[0] if len(found) == 1 else None


def _forbidden(principal: Principal, required: keys.Scope) -> Forbidden:
    return Forbidden(
        f"key {principal.key_id} has scope {principal.scope.label}; this needs {required.label}",
        required=required.label,
        scope=principal.scope.label,
    )


def credential_in_query(scope: Scope) -> str | None:
    """The name of a query parameter that carries a credential (``api_key``, ``token``...)."""
    raw: bytes = scope["query_string"]
    for name, _ in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        if secret_param(name):
            return str(name)
    return None


class OpenRoute(Route):
    """A ``GET`` route that answers without a key: a page shell or a static asset that holds
    no data. Only routes of this class are open; the app adds them itself (not through an
    included router, which would copy them into plain routes)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, name: str) -> None:
        super().__init__(path, endpoint, methods=["GET"], name=name, include_in_schema=False)


class AuthMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._table: list[tuple[APIRoute, keys.Scope]] | None = None
        self._open: tuple[tuple[str, ...], list[OpenRoute]] | None = None

    def _is_open(self, scope: Scope) -> bool:
        """Whether an :class:`OpenRoute` serves this request (its method included)."""
        if self._open is None:
            routes = [r for r in scope["app"].routes if isinstance(r, OpenRoute)]
            # what each path begins with before its first parameter: most requests (the
            # API's) are told apart by this alone
            self._open = (tuple({r.path.split("{")[0] for r in routes}), routes)
        prefixes, routes = self._open
        if not scope["path"].startswith(prefixes):
            return False
        return any(route.matches(scope)[0] is Match.FULL for route in routes)

    def _required(self, scope: Scope) -> keys.Scope:
        if self._table is None:
            self._table = [
                (r, s)
                for r in api_routes(scope["app"].routes)
                if (s := declared_scope(r)) is not None
            ]
        for route, required in self._table:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return required
        return keys.Scope.READ

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        orch = scope["app"].state.orchestrator
        if b"=" in scope["query_string"] and (named := credential_in_query(scope)) is not None:
            refused = InvalidParams(
                "credentials go in the Authorization header (Bearer), never in a URL",
                field=f"query.{named}",
            )
            await error_response(status_of(refused), refused.body())(scope, receive, send)
            return
        guard = orch.auth
        try:
            on = await guard.enabled()
        except Exception as exc:  # the database is down: keys cannot be looked at
            await self._refuse(orch, outage_of(exc), scope, receive, send)
            return
        if not on or scope["path"] in guard.open_paths or self._is_open(scope):
            await self.app(scope, receive, send)
            return
        raw = header(scope, b"authorization")
        text = keys.bearer(None if raw is None else raw.decode("latin-1"))
        client = scope.get("client")
        address = str(client[0]) if client else ""
        try:
            principal = await guard.principal_from(text, address)
            required = self._required(scope)
            if not principal.allows(required):
                raise _forbidden(principal, required)
            orch.rates.request(principal.key_id)
        except OrchestratorError as exc:
            await self._refuse(orch, exc, scope, receive, send)
            return
        except Exception as exc:  # the database is down: the key cannot be checked
            await self._refuse(orch, outage_of(exc), scope, receive, send)
            return
        scope[PRINCIPAL] = principal
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(
        orch: Any, exc: OrchestratorError, scope: Scope, receive: Receive, send: Send
    ) -> None:
        orch.metrics.refusals.labels(exc.code).inc()
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else None
        await error_response(status_of(exc), exc.body(), headers)(scope, receive, send)


def outage_of(exc: Exception) -> OrchestratorError:
    """The database outage ``exc`` says (503 or 507, retriable); anything else is raised."""
    outage = unavailable(exc)
    if outage is None:
        raise exc
    return outage
