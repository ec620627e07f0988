"""Run bundles: export, import into another database (and backend), idempotency, refusals."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import sqlalchemy as sa

from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from tests.conftest import TABLES, make_settings
from tests.helpers import make_flow, make_run, submit, wait_status
from tests.pg import create_database, drop_database, require_postgres
from worker_adapters.sim import SimAdapter

Bundle = dict[str, Any]
TOOL = {
    "name": "lookup",
    "description": "find a word",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    "executor": {"kind": "builtin", "name": "lookup"},
}


@dataclass
class Server:
    orch: Orchestrator
    client: httpx.AsyncClient


@asynccontextmanager
async def serve(url: str) -> AsyncIterator[Server]:
    orch = Orchestrator(make_settings(url))
    await orch.start()
    try:
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url="http://second") as c:
            yield Server(orch, c)
    finally:
        await orch.stop()


@pytest.fixture
def fresh_pg() -> Iterator[str]:
    """An empty PostgreSQL database of its own (the server migrates it at start)."""
    require_postgres()
    url = create_database()
    yield url
    drop_database(url)


@pytest.fixture
def second_url(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh database on the backend of ``db_url``."""
    if db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'second.db'}"
    url: str = request.getfixturevalue("fresh_pg")
    return url


@pytest.fixture
async def second(second_url: str) -> AsyncIterator[Server]:
    async with serve(second_url) as server:
        yield server


async def row_counts(orch: Orchestrator) -> dict[str, int]:
    async with orch.db.read() as session:
        return {
            t: (await session.execute(sa.text(f"SELECT count(*) FROM {t}"))).scalar_one()
            for t in TABLES
        }


async def record_run(c: httpx.AsyncClient) -> tuple[str, list[str]]:
    """A finished run with steps, a fact of a step, a fact of the run and a checkpoint."""
    flow_id = await make_flow(
        c, ast={"program": "river", "n": 1.5}, tools=[TOOL], labels={"team": "a"}
    )
    run_id = await make_run(c, flow_id, seed=7, budgets={"max_tokens_out": 500})
    step_ids = []
    for i, prompt in enumerate(["Write a haiku about rivers.", "Ünïcödé — ✓ 川"]):
        r = await submit(c, run_id, token=f"s{i}", prompt=prompt, max_tokens=12 + i)
        assert r.status_code == 202, r.text
        step_ids.append(r.json()["step_id"])
        await wait_status(c, step_ids[-1], "succeeded")
    for body in (
        {"type": "note", "data": {"text": "ok", "x": [1, 2.5]}, "step_id": step_ids[0]},
        {"type": "score", "data": 0.25},
    ):
        assert (await c.post(f"/v1/runs/{run_id}/facts", json=body)).status_code == 201
    cp = {"state": {"k": "v", "n": 3}, "step_id": step_ids[1]}
    assert (await c.post(f"/v1/runs/{run_id}/checkpoint", json=cp)).status_code == 201
    return run_id, step_ids


async def export(c: httpx.AsyncClient, run_id: str) -> Bundle:
    r = await c.get(f"/v1/runs/{run_id}/export")
    assert r.status_code == 200, r.text
    bundle: Bundle = r.json()
    return bundle


async def assert_same_run(
    a: httpx.AsyncClient, b: httpx.AsyncClient, run_id: str, step_ids: list[str]
) -> None:
    """Both servers answer the same records, and stream the same bytes."""
    for path in ("", "/facts", "/checkpoints"):
        ra, rb = await a.get(f"/v1/runs/{run_id}{path}"), await b.get(f"/v1/runs/{run_id}{path}")
        assert rb.status_code == 200, rb.text
        assert rb.json() == ra.json(), path
    for position, step_id in enumerate(step_ids):
        one = (await a.get(f"/v1/steps/{step_id}")).json()
        two = (await b.get(f"/v1/steps/{step_id}")).json()
        assert two == one
        assert two["position"] == position and two["provenance"] and two["output"]["text"]
        stream_a = (await a.get(f"/v1/steps/{step_id}/stream")).content
        stream_b = (await b.get(f"/v1/steps/{step_id}/stream")).content
        assert b"event: end" in stream_b
        assert stream_b == stream_a


async def check_round_trip(source: httpx.AsyncClient, target: httpx.AsyncClient) -> None:
    run_id, step_ids = await record_run(source)
    bundle = await export(source, run_id)
    assert bundle["format"] == "orchestratord.run/v1"
    assert [len(bundle[k]) for k in ("steps", "facts", "checkpoints")] == [2, 2, 1]
    assert all("id" not in ev for ev in bundle["events"])
    assert bundle["run"]["created_at"].endswith("Z")

    r = await target.post("/v1/runs:import", json=bundle)
    assert r.status_code == 201, r.text
    assert r.json() == (await source.get(f"/v1/runs/{run_id}")).json()
    await assert_same_run(source, target, run_id, step_ids)
    assert await export(target, run_id) == bundle  # every row, event data byte for byte

    # The imported run goes on: the flow, the ids and the run cursors carry over.
    flow_id = bundle["flow"]["flow_id"]
    assert (await target.get(f"/v1/flows/{flow_id}")).json()["labels"] == {"team": "a"}
    follow = await target.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": run_id}
    )
    assert follow.status_code == 201, follow.text
    new_step = (await submit(target, run_id, token="s-next", max_tokens=4)).json()["step_id"]
    step = await wait_status(target, new_step, "succeeded")
    assert step["position"] == 2
    after = await export(target, run_id)
    cursors = [ev["run_seq"] for ev in after["events"]]
    assert cursors == list(range(len(after["events"])))
    assert after["events"][: len(bundle["events"])] == bundle["events"]


async def test_export_then_import_into_a_fresh_database(
    client: httpx.AsyncClient, second: Server
) -> None:
    await check_round_trip(client, second.client)


@pytest.mark.parametrize("direction", ["sqlite-to-postgresql", "postgresql-to-sqlite"])
async def test_bundle_crosses_backends(direction: str, fresh_pg: str, tmp_path: Path) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'recorded.db'}"
    urls = (sqlite_url, fresh_pg) if direction.startswith("sqlite") else (fresh_pg, sqlite_url)
    async with serve(urls[0]) as source, serve(urls[1]) as target:
        await check_round_trip(source.client, target.client)


async def test_reimport_is_idempotent(client: httpx.AsyncClient, second: Server) -> None:
    run_id, _ = await record_run(client)
    bundle = await export(client, run_id)
    first = await second.client.post("/v1/runs:import", json=bundle)
    assert first.status_code == 201, first.text
    counts = await row_counts(second.orch)
    again = await second.client.post("/v1/runs:import", json=bundle)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert await row_counts(second.orch) == counts
    # the server it came from holds the same run
    home = await client.post("/v1/runs:import", json=bundle)
    assert home.status_code == 200, home.text


async def test_columns_missing_from_an_older_bundle_take_their_defaults(
    client: httpx.AsyncClient, second: Server
) -> None:
    run_id, _ = await record_run(client)
    bundle = await export(client, run_id)
    older = copy.deepcopy(bundle)
    for step in older["steps"]:
        assert step.pop("error") is None and step.pop("budget_clamped") is False
    r = await second.client.post("/v1/runs:import", json=older)
    assert r.status_code == 201, r.text
    assert await export(second.client, run_id) == bundle
    # a required column cannot be left out
    del older["run"]["seed"]
    older["run"]["run_id"] = "run_01JNEWER"
    r = await second.client.post("/v1/runs:import", json=older)
    assert r.status_code == 422 and r.json()["details"]["errors"][0]["field"] == "run.seed"


async def test_another_bundle_of_a_stored_run_conflicts(
    client: httpx.AsyncClient, second: Server
) -> None:
    run_id, _ = await record_run(client)
    bundle = await export(client, run_id)
    assert (await second.client.post("/v1/runs:import", json=bundle)).status_code == 201
    counts = await row_counts(second.orch)
    changed = copy.deepcopy(bundle)
    changed["steps"][0]["client_token"] = "another-token"
    r = await second.client.post("/v1/runs:import", json=changed)
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "CONFLICT" and r.json()["details"]["run_id"] == run_id
    # a new run reusing the stored steps' ids is refused, and writes nothing
    other = copy.deepcopy(bundle)
    other["run"]["run_id"] = "run_01JOTHER"
    for table in ("steps", "events", "facts", "checkpoints"):
        for row in other[table]:
            row["run_id"] = "run_01JOTHER"
    r = await second.client.post("/v1/runs:import", json=other)
    assert r.status_code == 409, r.text
    assert sorted(r.json()["details"]["taken"]["steps"]) == sorted(
        s["step_id"] for s in bundle["steps"]
    )
    assert await row_counts(second.orch) == counts


async def test_a_flow_stored_with_another_hash_conflicts(
    client: httpx.AsyncClient, second: Server
) -> None:
    run_id, _ = await record_run(client)
    bundle = await export(client, run_id)
    flow = bundle["flow"]
    body = {k: flow[k] for k in ("ast", "tools", "config", "labels")}
    assert (await second.client.post("/v1/flows", json=body)).status_code == 201
    async with second.orch.db.write() as session:
        await session.execute(
            sa.text("UPDATE flows SET hash = :h WHERE flow_id = :f"),
            {"h": "sha256:" + "0" * 64, "f": flow["flow_id"]},
        )
    r = await second.client.post("/v1/runs:import", json=bundle)
    assert r.status_code == 409, r.text
    assert r.json()["details"]["flow_id"] == flow["flow_id"]
    assert (await row_counts(second.orch))["runs"] == 0


async def test_export_refuses_a_run_with_unended_steps(
    client: httpx.AsyncClient, orch: Orchestrator
) -> None:
    adapter = orch.pools.pools["local"].replicas[0].adapter
    assert isinstance(adapter, SimAdapter)
    adapter.tokens_per_s = 5.0
    run_id = await make_run(client)
    step_id = (await submit(client, run_id, max_tokens=1000)).json()["step_id"]
    r = await client.get(f"/v1/runs/{run_id}/export")
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "CONFLICT"
    assert r.json()["details"]["steps"] == [step_id]
    assert (await client.post(f"/v1/steps/{step_id}/cancel")).status_code == 202
    await wait_status(client, step_id, "cancelled")
    bundle = await export(client, run_id)
    assert [s["status"] for s in bundle["steps"]] == ["cancelled"]
    assert (await client.get("/v1/runs/run_nope/export")).status_code == 404


def _index(bundle: Bundle, step: int, seq: int) -> int:
    step_id = bundle["steps"][step]["step_id"]
    return next(
        i for i, ev in enumerate(bundle["events"]) if ev["step_id"] == step_id and ev["seq"] == seq
    )


def _gap(b: Bundle) -> str:
    del b["events"][_index(b, 0, 2)]
    return f"events[{_index(b, 0, 3)}].seq"


def _other_run(b: Bundle) -> str:
    b["events"][5]["run_id"] = "run_01JSOMEWHEREELSE"
    return "events[5].run_id"


def _not_ended(b: Bundle) -> str:
    b["steps"][1]["status"] = "running"
    return "steps[1].status"


def _wrong_format(b: Bundle) -> str:
    b["format"] = "orchestratord.run/v0"
    return "format"


def _no_terminal(b: Bundle) -> str:
    last = max(ev["seq"] for ev in b["events"] if ev["step_id"] == b["steps"][0]["step_id"])
    del b["events"][_index(b, 0, last)]
    return f"events[{_index(b, 0, last - 1)}].type"


def _data_differs(b: Bundle) -> str:
    i = _index(b, 1, 2)
    data = orjson.loads(b["events"][i]["data"])
    data["seq"] = 9
    b["events"][i]["data"] = orjson.dumps(data).decode()
    return f"events[{i}].data"


def _repeated_cursor(b: Bundle) -> str:
    b["events"][4]["run_seq"] = b["events"][3]["run_seq"]
    return "events[4].run_seq"


def _unknown_column(b: Bundle) -> str:
    b["steps"][0]["colour"] = "blue"
    return "steps[0].colour"


def _bad_time(b: Bundle) -> str:
    b["run"]["created_at"] = "yesterday"
    return "run.created_at"


def _tampered_flow(b: Bundle) -> str:
    b["flow"]["ast"]["n"] = 2
    return "flow.hash"


def _fact_of_unknown_step(b: Bundle) -> str:
    b["facts"][0]["emitted_by_step"] = "step_01JNOPE"
    return "facts[0].emitted_by_step"


MALFORMED: dict[str, Callable[[Bundle], str]] = {
    f.__name__.lstrip("_"): f
    for f in (
        _gap,
        _other_run,
        _not_ended,
        _wrong_format,
        _no_terminal,
        _data_differs,
        _repeated_cursor,
        _unknown_column,
        _bad_time,
        _tampered_flow,
        _fact_of_unknown_step,
    )
}


async def test_malformed_bundles_name_the_field_and_write_nothing(
    client: httpx.AsyncClient, second: Server
) -> None:
    run_id, _ = await record_run(client)
    bundle = await export(client, run_id)
    for name, mutate in MALFORMED.items():
        broken = copy.deepcopy(bundle)
        field = mutate(broken)
        r = await second.client.post("/v1/runs:import", json=broken)
        assert r.status_code == 422, (name, r.text)
        assert r.json()["details"]["errors"][0]["field"] == field, (name, r.text)
    assert await row_counts(second.orch) == dict.fromkeys(TABLES, 0)
    assert (await second.client.post("/v1/runs:import", json=bundle)).status_code == 201
