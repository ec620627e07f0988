"""A step's submission and its stream are answered ahead of FastAPI's routing; whatever they
hand on, FastAPI answers. Every answer equals the FastAPI route's own (an app without the hot
routes, on the same orchestrator)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestratord.api.app import create_app
from orchestratord.api.hot_routes import PASSED, HotRoute
from orchestratord.runtime import Orchestrator
from tests.helpers import make_run


class Seen:
    """Records, after each request, the route that answered it and whether it was handed on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.routes: list[tuple[str, bool]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
        if scope["type"] == "http":
            route = scope.get("route")
            self.routes.append((type(route).__name__, PASSED in scope))


@pytest.fixture
async def pair(
    orch: Orchestrator,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, Seen]]:
    """A client of the app, and one of the same app without its hot routes."""
    hot = create_app(orchestrator=orch)
    seen = Seen(hot)
    plain = create_app(orchestrator=orch)
    plain.router.routes[:] = [r for r in plain.router.routes if not isinstance(r, HotRoute)]
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=seen), base_url="http://t") as a,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=plain), base_url="http://t") as b,
    ):
        yield a, b, seen


def _same(a: httpx.Response, b: httpx.Response) -> dict[str, Any]:
    assert a.status_code == b.status_code, (a.text, b.text)
    body_a, body_b = a.json(), b.json()
    for body in (body_a, body_b):
        if isinstance(body, dict):
            body.pop("correlation_id", None)
            body.pop("step_id", None)
    assert body_a == body_b
    hidden = ("x-correlation-id", "content-length")
    assert {k: v for k, v in a.headers.items() if k not in hidden} == {
        k: v for k, v in b.headers.items() if k not in hidden
    }
    return dict(body_a)


def _step(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "llm_call",
        "client_token": uuid.uuid4().hex,
        "input": {"prompt": "p", "params": {"max_tokens": 1}},
    }
    body.update(kw)
    return body


async def test_a_valid_submission_is_answered_by_the_hot_route(
    pair: tuple[httpx.AsyncClient, httpx.AsyncClient, Seen],
) -> None:
    hot, plain, seen = pair
    run_id = await make_run(plain)
    token = uuid.uuid4().hex
    first = await hot.post(f"/v1/runs/{run_id}/steps", json=_step(client_token=token))
    assert first.status_code == 202
    assert seen.routes[-1] == ("HotRoute", False)
    # the same client token through the FastAPI route: the same step, 200
    again = await plain.post(f"/v1/runs/{run_id}/steps", json=_step(client_token=token))
    assert again.status_code == 200 and again.json()["step_id"] == first.json()["step_id"]
    assert first.headers.keys() == again.headers.keys()
    assert first.headers["content-type"] == again.headers["content-type"]


@pytest.mark.parametrize(
    ("path", "content", "headers"),  # all refused but "query" (FastAPI ignores an unknown one)
    [
        ("/v1/runs/{run}/steps", b"{not json", {"content-type": "application/json"}),
        ("/v1/runs/{run}/steps", b'{"type": "llm_call"}', {"content-type": "application/json"}),
        ("/v1/runs/{run}/steps", b'{"type": "nope"}', {"content-type": "application/json"}),
        ("/v1/runs/{run}/steps", b"[1, 2]", {"content-type": "application/json"}),
        ("/v1/runs/{run}/steps", b'{"x": NaN}', {"content-type": "application/json"}),
        (
            "/v1/runs/{run}/steps",
            b'{"type": "checkpoint", "client_token": "big", '
            b'"input": {"state": {"n": 18446744073709551616}}}',
            {"content-type": "application/json"},
        ),
        ("/v1/runs/{run}/steps", None, {"content-type": "text/plain"}),
        ("/v1/runs/{run}/steps?x=1", None, {"content-type": "application/json"}),
        ("/v1/runs/run_missing/steps", None, {"content-type": "application/json"}),
        ("/v1/runs/run%00x/steps", None, {"content-type": "application/json"}),
    ],
    ids=[
        "malformed",
        "missing-input",
        "unknown-type",
        "not-object",
        "nan",
        "integer-past-64-bits",
        "text-plain",
        "query",
        "unknown-run",
        "nul",
    ],
)
async def test_submissions_handed_on_answer_as_the_fastapi_route(
    pair: tuple[httpx.AsyncClient, httpx.AsyncClient, Seen],
    path: str,
    content: bytes | None,
    headers: dict[str, str],
) -> None:
    hot, plain, _ = pair
    run_id = await make_run(plain)
    url = path.format(run=run_id)

    def body() -> bytes:  # a fresh client token for each valid one
        return content if content is not None else httpx.Request("POST", "/", json=_step()).content

    a = await hot.post(url, content=body(), headers=headers)
    b = await plain.post(url, content=body(), headers=headers)
    _same(a, b)


async def test_streams_answer_as_the_fastapi_route(
    pair: tuple[httpx.AsyncClient, httpx.AsyncClient, Seen],
) -> None:
    hot, plain, seen = pair
    run_id = await make_run(plain)
    step_id = (await plain.post(f"/v1/runs/{run_id}/steps", json=_step())).json()["step_id"]
    await plain.get(f"/v1/steps/{step_id}/stream")  # to its end: both read a finished log
    cases: list[tuple[str, dict[str, str]]] = [
        (f"/v1/steps/{step_id}/stream", {}),
        (f"/v1/steps/{step_id}/stream", {"last-event-id": "1"}),
        (f"/v1/steps/{step_id}/stream", {"last-event-id": "+1"}),
        (f"/v1/steps/{step_id}/stream?after=0", {}),
        (f"/v1/steps/{step_id}/stream?after=x", {}),
        ("/v1/steps/step_missing/stream", {}),
        ("/v1/steps/step%00/stream", {}),
    ]
    for url, headers in cases:
        a = await hot.get(url, headers=headers)
        b = await plain.get(url, headers=headers)
        assert a.status_code == b.status_code, url
        if a.status_code == 200:
            assert a.text == b.text and a.headers["content-type"] == b.headers["content-type"]
        else:
            _same(a, b)
    answered = [r for r in seen.routes if r[0] == "HotRoute"]
    # the three without a query string, the missing step and the NUL answered by the hot route
    assert len(answered) == 5, seen.routes


def _app(extra_header: bool = False, extra_dependency: bool = False) -> Any:
    """An app with the two documented routes as the hot routes expect them, or not."""
    from fastapi import Depends, FastAPI, Header

    from orchestrator_core.keys import Principal
    from orchestratord.api.auth import READ, WRITE
    from orchestratord.api.json_keys import refuse_duplicate_keys
    from orchestratord.api.params import refuse_nul

    async def audit() -> None:
        return None

    app = FastAPI(dependencies=[Depends(refuse_nul), Depends(refuse_duplicate_keys)])
    route_deps = [Depends(audit)] if extra_dependency else []

    if extra_header:

        @app.post("/v1/runs/{run_id}/steps")
        async def submit_new(
            run_id: str,
            body: dict[str, Any],
            accept: str | None = Header(None),
            x_new: str | None = Header(None),
            principal: Principal | None = WRITE,
        ) -> None:
            raise AssertionError("not called")

    else:

        @app.post("/v1/runs/{run_id}/steps", dependencies=route_deps)
        async def submit(
            run_id: str,
            body: dict[str, Any],
            accept: str | None = Header(None),
            principal: Principal | None = WRITE,
        ) -> None:
            raise AssertionError("not called")

    @app.get("/v1/steps/{step_id}/stream")
    async def stream(
        step_id: str,
        last_event_id: str | None = Header(None),
        after: int = 0,
        principal: Principal | None = READ,
    ) -> None:
        raise AssertionError("not called")

    return app


def test_a_route_the_hot_route_would_answer_differently_stops_the_app() -> None:
    """A header or a dependency added to the FastAPI route would be skipped on the hot path:
    the app refuses to start; as the hot routes expect them, it starts."""
    from orchestratord.api import hot_routes

    hot_routes.install(_app())
    with pytest.raises(RuntimeError, match="x-new"):
        hot_routes.install(_app(extra_header=True))
    with pytest.raises(RuntimeError, match="audit"):
        hot_routes.install(_app(extra_dependency=True))
