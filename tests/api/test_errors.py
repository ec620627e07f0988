from __future__ import annotations

import uuid

import httpx

from tests.helpers import make_run

ERROR_KEYS = {"code", "message", "retriable", "retry_after_ms", "details", "correlation_id"}


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/flows", content=b'{"ast": ', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    body = r.json()
    assert set(body) == ERROR_KEYS
    assert body["code"] == "INVALID_PARAMS"
    assert body["correlation_id"] == r.headers["x-correlation-id"]


async def test_unknown_route_is_404_with_body(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/nothing")
    assert r.status_code == 404
    assert set(r.json()) == ERROR_KEYS
    assert r.json()["code"] == "NOT_FOUND"


async def test_correlation_id_echoed_everywhere(client: httpx.AsyncClient) -> None:
    cid = "req-1234"
    for method, path in (("GET", "/v1/pools"), ("GET", "/v1/runs/nope"), ("POST", "/v1/flows")):
        r = await client.request(
            method, path, headers={"X-Correlation-Id": cid}, json={} if method == "POST" else None
        )
        assert r.headers["x-correlation-id"] == cid
        if r.status_code >= 400:
            assert r.json()["correlation_id"] == cid


async def test_correlation_id_generated(client: httpx.AsyncClient) -> None:
    a = await client.get("/v1/pools")
    b = await client.get("/v1/runs/nope")
    assert uuid.UUID(a.headers["x-correlation-id"])
    assert b.json()["correlation_id"] == b.headers["x-correlation-id"]
    assert a.headers["x-correlation-id"] != b.headers["x-correlation-id"]


async def test_invalid_correlation_id_is_replaced(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/pools", headers={"X-Correlation-Id": "bad id with spaces"})
    assert r.headers["x-correlation-id"] != "bad id with spaces"


async def test_internal_error_has_the_body_and_id(client: httpx.AsyncClient, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from orchestratord.runs import service as runs

    async def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(runs, "get_run", boom)
    r = await client.get("/v1/runs/anything", headers={"X-Correlation-Id": "c-500"})
    assert r.status_code == 500
    body = r.json()
    assert body["code"] == "INTERNAL"
    assert body["correlation_id"] == "c-500"
    assert "disk on fire" not in body["message"]


async def test_wrong_content_type_or_body_shape(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    r = await client.post(f"/v1/runs/{run_id}/steps", json=[1, 2])
    assert r.status_code == 422
    assert r.json()["code"] == "INVALID_PARAMS"
