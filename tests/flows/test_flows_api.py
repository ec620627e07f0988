from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from orchestratord.runtime import Orchestrator

TOOL = {
    "name": "search",
    "description": "web search",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    "executor": {"kind": "http", "url": "http://127.0.0.1:9/search"},
}


async def test_same_content_same_id(client: httpx.AsyncClient) -> None:
    body = {"ast": {"steps": [1, 2.0, "x"]}, "tools": [TOOL], "config": {"k": 1}}
    first = await client.post("/v1/flows", json=body)
    assert first.status_code == 201
    again = await client.post("/v1/flows", json={**body, "labels": {"env": "other"}})
    assert again.status_code == 200
    assert again.json()["flow_id"] == first.json()["flow_id"]
    assert again.json()["hash"] == first.json()["hash"]
    assert first.json()["hash"].startswith("sha256:")
    # key order and 2.0 vs 2 do not change the content
    reordered = {"config": {"k": 1}, "tools": [TOOL], "ast": {"steps": [1, 2, "x"]}}
    assert (await client.post("/v1/flows", json=reordered)).json()["flow_id"] == first.json()[
        "flow_id"
    ]


async def test_changed_content_is_a_new_flow(client: httpx.AsyncClient) -> None:
    a = (await client.post("/v1/flows", json={"ast": {"v": 1}})).json()
    b = (await client.post("/v1/flows", json={"ast": {"v": 2}})).json()
    assert a["flow_id"] != b["flow_id"]


async def test_get_and_by_hash(client: httpx.AsyncClient) -> None:
    created = (
        await client.post("/v1/flows", json={"ast": [1], "tools": [TOOL], "labels": {"team": "x"}})
    ).json()
    got = (await client.get(f"/v1/flows/{created['flow_id']}")).json()
    assert got["ast"] == [1]
    assert got["tools"][0]["name"] == "search"
    assert got["labels"] == {"team": "x"}
    by_hash = await client.get(f"/v1/flows:by-hash/{created['hash']}")
    assert by_hash.status_code == 200
    assert by_hash.json()["flow_id"] == created["flow_id"]
    bare_hex = created["hash"].removeprefix("sha256:")
    assert (await client.get(f"/v1/flows:by-hash/{bare_hex}")).json()["flow_id"] == created[
        "flow_id"
    ]


async def test_unknown_flow_is_404(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/flows/flow_nope")
    assert r.status_code == 404
    assert r.json()["code"] == "NOT_FOUND"
    r = await client.get("/v1/flows:by-hash/sha256:00")
    assert r.status_code == 404


async def test_invalid_tool_schema_names_the_field(client: httpx.AsyncClient) -> None:
    bad = {**TOOL, "parameters": {"type": "objekt"}}
    r = await client.post("/v1/flows", json={"ast": {}, "tools": [TOOL, {**bad, "name": "b"}]})
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "INVALID_PARAMS"
    assert body["details"]["errors"][0]["field"] == "tools[1].parameters"


async def test_missing_ast_and_unknown_field(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/flows", json={"tools": []})
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "ast"
    r = await client.post("/v1/flows", json={"ast": 1, "colour": "red"})
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "colour"


async def test_bad_executor(client: httpx.AsyncClient) -> None:
    tool = {**TOOL, "executor": {"kind": "ftp"}}
    r = await client.post("/v1/flows", json={"ast": 1, "tools": [tool]})
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"].startswith("tools.0.executor")


async def test_out_of_range_integer_is_bad_input(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/flows",
        content=b'{"ast": {"n": 100000000000000000000000}}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert r.json()["details"]["errors"][0]["field"] == "ast.n"


async def test_a_flow_stored_by_a_concurrent_request_is_the_answer(
    client: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes storing the same content at once: the one whose insert meets the
    other's row answers with that flow (200), not an error."""
    first = await client.post("/v1/flows", json={"ast": {"race": 1}, "labels": {"by": "a"}})
    assert first.status_code == 201
    real_get = AsyncSession.get
    looks: list[str] = []

    async def not_yet_committed(self: AsyncSession, entity: Any, ident: Any, **kw: Any) -> Any:
        looks.append(ident)
        if len(looks) == 1:  # the other request's row, not committed when this one looked
            return None
        return await real_get(self, entity, ident, **kw)

    monkeypatch.setattr(AsyncSession, "get", not_yet_committed)
    again = await client.post("/v1/flows", json={"ast": {"race": 1}, "labels": {"by": "b"}})
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert looks == [first.json()["flow_id"]] * 2
