"""The two requests every step makes, answered ahead of FastAPI's routing and parameters.

``POST /v1/runs/{run_id}/steps`` and ``GET /v1/steps/{step_id}/stream``: in-process, FastAPI's
route matching (it walks every route) and its request handling (dependencies, body, query)
were about a fifth of a submission's CPU. A :class:`HotRoute` sits first in the app's routes
and matches its path with one regex. A request it can answer, it answers with the same code
the FastAPI route runs (``answer_submission``, ``answer_step_stream``), after the same checks
(NUL in the path, the key's scope, the body validated into the same model). Every other
request (a body that is not a valid step, a content type other than JSON, a query string)
goes on to the FastAPI route with its body as read, so errors keep one source and the
OpenAPI document keeps describing both.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

from contracts.steps import AnyStepCreate, StepCreate
from orchestrator_core import keys
from orchestrator_core.errors import InvalidParams
from orchestratord.api.asgi import header, replay
from orchestratord.api.auth import api_routes, authorize
from orchestratord.api.json_keys import duplicate_key, refuse_duplicate_keys
from orchestratord.api.params import refuse_nul
from orchestratord.steps.routes import answer_submission, wants_stream
from orchestratord.streams.routes import answer_step_stream, resume_from

PASSED = "orchestratord.hot_route_passed"  # set on a request handed to the FastAPI route

Handler = Callable[["HotRoute", Scope, Receive, Send], Awaitable[None]]


class HotRoute(BaseRoute):
    def __init__(self, method: str, path: str, pattern: str, handler: Handler) -> None:
        self.method = method
        self.path = self.path_format = path  # what a request's route is reported as
        self.name = f"hot {method} {path}"
        self.include_in_schema = False
        self._regex = re.compile(pattern)
        self._handler = handler

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if (
            scope["type"] != "http"
            or scope["method"] != self.method
            or PASSED in scope
            # served under a prefix (``--root-path``): FastAPI's routes know how to strip it;
            # the hot path is left out, which costs speed only
            or scope.get("root_path")
        ):
            return Match.NONE, {}
        m = self._regex.fullmatch(scope["path"])
        if m is None:
            return Match.NONE, {}
        return Match.FULL, {"path_params": m.groupdict(), "route": self}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handler(self, scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        raise NoMatchFound(name, path_params)

    async def pass_on(
        self, scope: Scope, receive: Receive, send: Send, body: bytes | None = None
    ) -> None:
        """To the FastAPI route: the app's router matches the request again, past this one;
        ``body``, when this route read it, is what the route will read."""
        scope[PASSED] = True
        if body is not None:
            receive = replay(body, receive)
        await scope["router"](scope, receive, send)


def _no_nul(scope: Scope) -> None:
    for name, value in scope["path_params"].items():
        if "\x00" in value:
            raise InvalidParams("must not contain NUL (\\u0000)", field=f"path.{name}")


def _json_content(scope: Scope) -> bool:
    value = header(scope, b"content-type")
    return value is not None and value.split(b";", 1)[0].strip().lower() == b"application/json"


async def _read_body(receive: Receive) -> bytes | None:
    """The request's body; None if the client left first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_STEP = TypeAdapter(StepCreate)
# orjson reads an integer past 64 bits as a float, where FastAPI's json.loads keeps it whole
# (and the models refuse it): a body holding 20 digits in a row goes the FastAPI way
_LONG_NUMBER = re.compile(rb"[0-9]{20}")


async def _submit(route: HotRoute, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["query_string"] or not _json_content(scope):
        await route.pass_on(scope, receive, send)
        return
    body = await _read_body(receive)
    if body is None:
        return
    if _LONG_NUMBER.search(body) is not None or duplicate_key(body) is not None:
        await route.pass_on(scope, receive, send, body)  # FastAPI's way refuses it
        return
    try:
        step: AnyStepCreate = _STEP.validate_python(orjson.loads(body))
    except (orjson.JSONDecodeError, ValidationError):
        await route.pass_on(scope, receive, send, body)  # FastAPI words the error
        return
    _no_nul(scope)
    orch = scope["app"].state.orchestrator
    principal = authorize(scope, orch.auth, keys.Scope.WRITE)
    run_id = scope["path_params"]["run_id"]
    stream = wants_stream(header(scope, b"accept"))
    response = await answer_submission(orch, run_id, step, principal, stream=stream)
    await response(scope, receive, send)


async def _step_stream(route: HotRoute, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["query_string"]:
        await route.pass_on(scope, receive, send)
        return
    raw = header(scope, b"last-event-id")
    last_event_id = None if raw is None else raw.decode("latin-1")
    _no_nul(scope)
    orch = scope["app"].state.orchestrator
    principal = authorize(scope, orch.auth, keys.Scope.READ)
    start = resume_from(last_event_id, None)
    step_id = scope["path_params"]["step_id"]
    response = await answer_step_stream(orch, step_id, start, principal)
    await response(scope, receive, send)


# method, path, its regex, the handler, the parameters of the FastAPI route it answers for
# (each handler reads these, or hands the request on: any query string goes on), and the
# key scope that route requires
HOT: tuple[tuple[str, str, str, Handler, frozenset[tuple[str, str]], keys.Scope], ...] = (
    (
        "POST",
        "/v1/runs/{run_id}/steps",
        r"/v1/runs/(?P<run_id>[^/]+)/steps",
        _submit,
        frozenset({("path", "run_id"), ("body", "body"), ("header", "accept")}),
        keys.Scope.WRITE,
    ),
    (
        "GET",
        "/v1/steps/{step_id}/stream",
        r"/v1/steps/(?P<step_id>[^/]+)/stream",
        _step_stream,
        frozenset({("path", "step_id"), ("header", "last-event-id"), ("query", "after")}),
        keys.Scope.READ,
    ),
)


def route_params(dependant: Any, out: set[tuple[str, str]] | None = None) -> set[tuple[str, str]]:
    """What a FastAPI route reads from a request, its dependencies' included:
    ``{("header", "last-event-id"), ...}``."""
    out = set() if out is None else out
    for kind in ("path", "query", "header", "cookie", "body"):
        out.update((kind, field.alias) for field in getattr(dependant, f"{kind}_params"))
    for sub in dependant.dependencies:
        route_params(sub, out)
    return out


def _calls(dependant: Any) -> Iterator[Any]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def install(app: Any) -> None:
    """Put the hot routes first. Each must shadow a documented FastAPI route that reads
    exactly the parameters it knows and depends on exactly what it checks (the app's
    ``refuse_nul`` and ``refuse_duplicate_keys``, the route's scope): anything added to the
    route and not here would be skipped on the hot path, so the app refuses to start
    instead."""
    app_deps = [d.dependency for d in app.router.dependencies]
    if app_deps != [refuse_nul, refuse_duplicate_keys]:
        raise RuntimeError(
            f"the app depends on {app_deps}; the hot routes check refuse_nul and"
            " refuse_duplicate_keys"
        )
    routes = {(m, r.path): r for r in api_routes(app.routes) for m in r.methods or ()}
    for method, path, pattern, handler, params, scope in HOT:
        route = routes.get((method, path))
        if route is None:
            raise RuntimeError(f"{method} {path}: no FastAPI route to hand requests on to")
        if (found := route_params(route.dependant)) != params:
            raise RuntimeError(
                f"{method} {path} reads {sorted(found)}; its hot route knows {sorted(params)}"
            )
        # the app's own dependencies are in the route's where the route was added to the app
        # itself, not where it came with an included router
        calls = [c for c in _calls(route.dependant) if c not in (refuse_nul, refuse_duplicate_keys)]
        if [getattr(c, "scope", None) for c in calls] != [scope]:
            raise RuntimeError(f"{method} {path} depends on {calls}; its hot route checks {scope}")
        app.router.routes.insert(0, HotRoute(method, path, pattern, handler))
