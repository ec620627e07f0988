"""Limits at the edge: too many or too large request headers answer 431 naming the limit;
a JSON body whose object names a key twice answers 400 naming the key, and nothing of it is
stored; keys repeated across different objects are fine."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import make_flow, make_run

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_too_many_headers_are_refused_naming_the_limit(
    module_client: httpx.AsyncClient,
) -> None:
    many = {f"x-h{i}": "v" for i in range(120)}
    r = await module_client.get("/healthz", headers=many)
    assert r.status_code == 431, r.text
    assert r.json()["details"]["limit"] == "limits.max_headers"
    few = {f"x-h{i}": "v" for i in range(50)}
    assert (await module_client.get("/healthz", headers=few)).status_code == 200


async def test_headers_too_large_are_refused_naming_the_limit(
    module_client: httpx.AsyncClient,
) -> None:
    r = await module_client.get("/healthz", headers={"x-big": "a" * 100_000})
    assert r.status_code == 431, r.text
    body = r.json()
    assert (body["code"], body["details"]["limit"]) == (
        "LIMIT_EXCEEDED",
        "limits.max_header_bytes",
    )


async def test_a_repeated_key_is_refused_naming_it_and_nothing_is_stored(
    module_client: httpx.AsyncClient,
) -> None:
    run_id = await make_run(module_client)
    bodies = [
        # the step's own keys, then a nested one (the hot route and FastAPI's alike)
        b'{"type": "llm_call", "client_token": "a", "client_token": "b", "input": {"prompt": "x"}}',
        b'{"type": "llm_call", "client_token": "c",'
        b' "input": {"prompt": "x", "params": {"max_tokens": 2, "max_tokens": 2000}}}',
    ]
    for raw, key in zip(bodies, ("client_token", "max_tokens"), strict=True):
        r = await module_client.post(
            f"/v1/runs/{run_id}/steps", content=raw, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400, r.text
        error = r.json()
        assert error["details"]["errors"][0]["field"] == f"body.{key}"
        assert repr(key) in error["message"]
    assert (await module_client.get(f"/v1/runs/{run_id}/steps")).json() == []
    r = await module_client.post(
        "/v1/flows",
        content=b'{"ast": {"a": 1, "a": 2}}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "'a'" in r.json()["message"], r.text


async def test_keys_repeated_across_objects_are_fine(module_client: httpx.AsyncClient) -> None:
    run_id = await make_run(module_client, await make_flow(module_client, {"k": 1}))
    body = {
        "type": "llm_call",
        "client_token": "chat",
        "input": {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"},
            ],
            "params": {"max_tokens": 2},
        },
    }
    r = await module_client.post(f"/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 202, r.text
