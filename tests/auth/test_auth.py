"""API keys and scopes: every route refuses a missing key, a wrong key and a low scope."""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from orchestrator_core.keys import Scope
from orchestratord.api.app import create_app
from orchestratord.api.auth import api_routes, declared_scope
from orchestratord.auth import store
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from tests.conftest import make_settings
from tests.helpers import make_run, submit, wait_status

OPEN = {"/healthz"}


ADMIN_ROUTES = {
    ("POST", "/v1/runs:import"),
    ("POST", "/v1/pools/{pool_id}/replicas/{replica_id}/drain"),
    ("POST", "/v1/pools/{pool_id}/replicas/{replica_id}/undrain"),
    ("POST", "/v1/pools"),
    ("POST", "/v1/pools/provision"),
    ("DELETE", "/v1/pools/{pool_id}"),
}


def _routes() -> list[APIRoute]:
    app = create_app(Settings(database_url="sqlite:///unused.db"))
    return list(api_routes(app.routes))


def test_every_route_declares_its_scope() -> None:
    routes = _routes()
    assert len(routes) > 20
    for route in routes:
        scope = declared_scope(route)
        if route.path in OPEN:
            assert scope is None, route.path
            continue
        assert scope is not None, f"{route.path} declares no scope"
        methods = route.methods or set()
        if any((method, route.path) in ADMIN_ROUTES for method in methods):
            assert scope is Scope.ADMIN, route.path
        elif methods <= {"GET", "HEAD"}:
            assert scope is Scope.READ, route.path
        else:
            assert scope is Scope.WRITE, route.path


async def _key(orch: Orchestrator, scope: Scope, name: str | None = None) -> str:
    async with orch.db.write() as session:
        return await store.create(session, scope=scope, name=name)


@pytest.fixture
def settings(db_url: str) -> Settings:
    # every route is asked with wrong keys: more than one address may send in a minute
    return make_settings(db_url, auth={"cache_s": 0, "max_failures_per_minute": 0})


@pytest.fixture
async def keys(orch: Orchestrator) -> dict[Scope, str]:
    return {s: await _key(orch, s, f"test {s.label}") for s in Scope}


def _calls() -> list[tuple[str, str, Scope]]:
    """(method, concrete path, required scope) for every declared route."""
    calls = []
    for route in _routes():
        scope = declared_scope(route)
        if scope is None:
            continue
        path = re.sub(r"\{[^}]+\}", "x1", route.path)
        for method in sorted(route.methods or ()):
            calls.append((method, path, scope))
    return calls


async def _call(
    client: httpx.AsyncClient, method: str, path: str, key: str | None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    body: dict[str, Any] | None = {} if method != "GET" else None
    return await client.request(method, path, headers=headers, json=body)


def _assert_error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.request.method, r.request.url.path, r.text)
    body: dict[str, Any] = r.json()
    assert body["code"] == code
    assert set(body) >= {"code", "message", "retriable", "retry_after_ms", "details"}
    assert body["correlation_id"] == r.headers["x-correlation-id"]
    return body


async def test_every_route_refuses_missing_wrong_and_low_scope_keys(
    client: httpx.AsyncClient, keys: dict[Scope, str]
) -> None:
    wrong = keys[Scope.ADMIN][:-4] + "AAAA"  # a real key id, a wrong secret
    calls = _calls()
    for method, path, required in calls:
        if path == "/metrics":  # open by default: tested closed below
            continue
        r = await _call(client, method, path, None)
        _assert_error(r, 401, "UNAUTHENTICATED")
        assert r.headers["www-authenticate"] == "Bearer"
        _assert_error(await _call(client, method, path, wrong), 401, "UNAUTHENTICATED")
        _assert_error(await _call(client, method, path, "not-a-key"), 401, "UNAUTHENTICATED")
        for scope in Scope:
            r = await _call(client, method, path, keys[scope])
            if scope < required:
                body = _assert_error(r, 403, "FORBIDDEN")
                assert body["details"] == {"required": required.label, "scope": scope.label}
            else:  # past auth: whatever the route answers to a made-up id or an empty body
                assert r.status_code not in (401, 403), (method, path, scope, r.text)


async def test_keys_in_use(client: httpx.AsyncClient, keys: dict[Scope, str]) -> None:
    write = {"Authorization": f"Bearer {keys[Scope.WRITE]}"}
    read = {"Authorization": f"Bearer {keys[Scope.READ]}"}
    client.headers.update(write)
    run_id = await make_run(client)
    step_id = (await submit(client, run_id)).json()["step_id"]
    await wait_status(client, step_id, "succeeded")
    r = await client.get(f"/v1/steps/{step_id}", headers=read)
    assert r.status_code == 200
    assert r.json()["status"] == "succeeded"
    # health and metrics answer without a key
    client.headers.pop("Authorization")
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/metrics")).status_code == 200
    # a path no route serves needs a key too: it says nothing to strangers
    _assert_error(await client.get("/v1/nowhere"), 401, "UNAUTHENTICATED")
    assert (await client.get("/v1/nowhere", headers=read)).status_code == 404
    metrics = (await client.get("/metrics")).text
    assert 'orchestratord_refusals_total{code="UNAUTHENTICATED"} 1.0' in metrics


async def test_revoked_key_is_refused(orch: Orchestrator, client: httpx.AsyncClient) -> None:
    key = await _key(orch, Scope.READ)
    headers = {"Authorization": f"Bearer {key}"}
    assert (await client.get("/v1/pools", headers=headers)).status_code == 200
    async with orch.db.write() as session:
        await store.revoke(session, key_id=key[3:15])
    _assert_error(await client.get("/v1/pools", headers=headers), 401, "UNAUTHENTICATED")
    # revoking the last key keeps auth on: the server does not open up
    _assert_error(await client.get("/v1/pools"), 401, "UNAUTHENTICATED")


async def test_auth_off_until_a_key_exists(orch: Orchestrator, client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/pools")).status_code == 200
    await _key(orch, Scope.READ)
    _assert_error(await client.get("/v1/pools"), 401, "UNAUTHENTICATED")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_auth_flag_requires_keys_before_any_exists(db_url: str) -> None:
    orch = Orchestrator(make_settings(db_url, auth={"enabled": True}))
    await orch.start()
    try:
        app = create_app(orchestrator=orch)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            _assert_error(await c.get("/v1/pools"), 401, "UNAUTHENTICATED")
            assert (await c.get("/healthz")).status_code == 200
    finally:
        await orch.stop()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_closed_metrics(db_url: str) -> None:
    orch = Orchestrator(make_settings(db_url, auth={"open_metrics": False, "cache_s": 0}))
    await orch.start()
    try:
        key = await _key(orch, Scope.READ)
        app = create_app(orchestrator=orch)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            _assert_error(await c.get("/metrics"), 401, "UNAUTHENTICATED")
            ok = await c.get("/metrics", headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200
            assert "orchestratord_" in ok.text
    finally:
        await orch.stop()


@pytest.fixture
async def captured(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


async def test_a_key_is_never_logged_or_echoed(
    orch: Orchestrator,
    live: httpx.AsyncClient,
    keys: dict[Scope, str],
    captured: pytest.LogCaptureFixture,
) -> None:
    key = keys[Scope.WRITE]
    secret = key[16:]  # after ok_<12 hex>_ (the secret may hold "_")
    headers = {"Authorization": f"Bearer {key}"}
    live.headers.update(headers)
    run_id = await make_run(live)
    step_id = (await submit(live, run_id)).json()["step_id"]
    await wait_status(live, step_id, "succeeded")
    texts = [
        (await live.get(f"/v1/steps/{step_id}/stream")).text,
        (await live.get(f"/v1/runs/{run_id}/export")).text,
        (await live.get("/v1/pools")).text,
        (await live.post("/v1/runs:import", json={})).text,  # 403 for a write key
        (await live.get("/v1/runs/nope")).text,
        (await live.get("/v1/pools", headers={"Authorization": f"Bearer {key}x"})).text,
    ]
    lines = [r.getMessage() for r in captured.records] + [str(r.__dict__) for r in captured.records]
    for text in texts + lines:
        assert secret not in text


async def test_a_burst_finding_the_cache_expired_looks_once(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests arriving together after the cached answer expired share one read: whether
    any key exists, and each key's verification (not one database read per request)."""
    import asyncio

    guard = orch.auth
    key = await _key(orch, Scope.READ)
    reads: dict[str, int] = {"any_key": 0, "find": 0}
    for name in reads:
        real = getattr(store, name)

        async def counted(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            reads[_name] += 1
            await asyncio.sleep(0.01)  # the others arrive while it reads
            return await _real(*a, **kw)

        monkeypatch.setattr(store, name, counted)
    guard.forget()
    assert all(await asyncio.gather(*(guard.enabled() for _ in range(30))))
    principals = await asyncio.gather(*(guard.principal(key) for _ in range(30)))
    assert {p.key_id for p in principals} == {key[3:15]}
    assert reads == {"any_key": 1, "find": 1}
    # one caller giving up does not take the answer from the others
    guard.forget()
    first = asyncio.ensure_future(guard.principal(key))
    await asyncio.sleep(0)
    others = asyncio.gather(*(guard.principal(key) for _ in range(5)))
    first.cancel()
    assert {p.key_id for p in await others} == {key[3:15]}
    assert reads["find"] == 2


async def test_keys_that_cannot_be_looked_up_answer_503_not_500(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the database is down the middleware cannot tell whether keys exist, nor check
    one: it answers the outage (503, retriable, Retry-After), as every route does."""
    from orchestrator_core.errors import DatabaseUnavailable

    key = await _key(orch, Scope.READ)

    async def down(*_: Any, **__: Any) -> Any:
        raise DatabaseUnavailable("connection refused")

    guard = orch.auth
    monkeypatch.setattr(guard, "_any_key", down)
    monkeypatch.setattr(guard, "_on_until", 0.0)
    monkeypatch.setattr(guard, "_on", False)
    r = await client.get("/v1/pools", headers={"Authorization": f"Bearer {key}"})
    _assert_error(r, 503, "DATABASE_UNAVAILABLE")
    assert r.json()["retriable"] is True and r.headers["Retry-After"]
    monkeypatch.setattr(guard, "_on", True)  # known to be on: the key itself is looked up
    monkeypatch.setattr(guard, "principal_from", down)
    r = await client.get("/v1/pools", headers={"Authorization": f"Bearer {key}"})
    _assert_error(r, 503, "DATABASE_UNAVAILABLE")
