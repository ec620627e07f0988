"""The SDK has every route of the OpenAPI document, and each answers its contract model.

``test_the_sdk_has_every_operation`` lists the document's operations and fails for one the
SDK lacks (or one it has that the server does not). The tours call every route through a
real server, the async client and the blocking one, recording which routes were sent: a
route added to the SDK but left out of the tour fails them too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

from contracts.events import EndEvent, RunEndEvent, StartedEvent, TokenEvent
from contracts.records import FactCreate
from contracts.runs import RunCreate, RunOut
from orchestrator_client import AsyncClient, Client, NotFound, steps
from orchestrator_client.calls import Call, Operation
from orchestrator_client.routes import Routes
from orchestrator_client.streams import StreamRoute
from orchestratord.settings import Settings
from tests.conftest import make_settings

FAKE_ENGINE = {
    "fake": {
        "command": "{python} -m test_harness.fake_openai_server --host {host} --port {port}",
        "model": "fake-model",
    }
}


def sdk_routes() -> set[tuple[str, str]]:
    found = set()
    for value in vars(Routes).values():
        if isinstance(value, Operation | StreamRoute):
            found.add((value.method, value.route))
    return found


def document_routes() -> set[tuple[str, str]]:
    document = json.loads(resources.files("contracts").joinpath("openapi.json").read_text())
    return {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }


def test_the_sdk_has_every_operation() -> None:
    missing = document_routes() - sdk_routes()
    assert not missing, f"operations of the OpenAPI document the SDK lacks: {sorted(missing)}"
    extra = sdk_routes() - document_routes()
    assert not extra, f"SDK routes the server does not have: {sorted(extra)}"


class Sent:
    """The routes a client sent (a wrapper of its transport's ``send``)."""

    def __init__(self) -> None:
        self.routes: set[tuple[str, str]] = set()

    def wrap(self, client: Any) -> None:
        send = client.send

        def noted(call: Call[Any]) -> Any:
            self.routes.add((call.method, call.route))
            return send(call)

        client.send = noted
        for name, value in vars(Routes).items():
            if isinstance(value, StreamRoute):
                self._note_stream(client, name, value)

    def _note_stream(self, client: Any, name: str, route: StreamRoute[Any]) -> None:
        bound = getattr(client, name)

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.routes.add(("GET", route.route))
            return bound(*args, **kwargs)

        setattr(client, name, noted)


@pytest.fixture
def settings(db_url: str) -> Settings:
    """The tests' settings, and a provisioner that starts the fake OpenAI engine."""
    return make_settings(db_url, provision={"commands": FAKE_ENGINE})


ECHO = {
    "name": "echo",
    "description": "say a text back",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    "executor": {"kind": "builtin", "name": "echo"},
}


async def test_every_route_through_the_async_client(server_url: str) -> None:
    sent = Sent()
    async with AsyncClient(server_url) as client:
        sent.wrap(client)
        assert (await client.healthz())["status"] == "ok"
        assert "orchestratord_" in await client.metrics()
        assert (await client.capabilities()).models
        assert (await client.capabilities_unversioned()).models

        flow = await client.create_flow({"ast": {"program": "tour"}, "tools": [ECHO]})
        assert (await client.create_flow({"ast": {"program": "tour"}, "tools": [ECHO]})) == flow
        assert (await client.get_flow(flow.flow_id)).hash == flow.hash
        assert (await client.get_flow_by_hash(flow.hash)).flow_id == flow.flow_id

        run = await client.create_run(flow.flow_id, RunCreate(seed=11))
        assert isinstance(run, RunOut) and run.seed == 11
        assert [r.run_id for r in await client.list_runs(flow_id=flow.flow_id)] == [run.run_id]
        assert (await client.get_run(run.run_id)).status == "running"

        accepted = await client.submit_step(run.run_id, steps.llm_call("Hello", max_tokens=6))
        events = [e async for e in client.stream_step(accepted.step_id)]
        assert isinstance(events[0], StartedEvent) and isinstance(events[-1], EndEvent)
        assert [e.i for e in events if isinstance(e, TokenEvent)] == list(range(6))
        step = await client.get_step(accepted.step_id)
        assert (step.status, step.usage.tokens_out) == ("succeeded", 6)
        assert [s.step_id for s in await client.list_steps(run.run_id)] == [step.step_id]
        echoed = await client.run_step(run.run_id, steps.tool_call("echo", {"text": "hi"}))
        assert (echoed.output or {})["result"] == {"text": "hi"}

        sleeping = await client.submit_step(
            run.run_id, steps.gate('facts.exists(f, f.type == "never")', wait_ms=60_000)
        )
        assert (await client.cancel_step(sleeping.step_id)).status in ("cancelling", "cancelled")

        fact = await client.add_fact(run.run_id, FactCreate(type="note", data={"n": 1}))
        assert [f.fact_id for f in await client.list_facts(run.run_id, type="note")] == [
            fact.fact_id
        ]
        assert fact.fact_id in [f.fact_id for f in await client.list_flow_facts(flow.flow_id)]
        checkpoint = await client.checkpoint(run.run_id, {"state": {"turn": 1}})
        listed = await client.list_checkpoints(run.run_id)
        assert checkpoint.checkpoint_id in [c.checkpoint_id for c in listed]
        fork = await client.fork_run(run.run_id, checkpoint.checkpoint_id)
        assert fork.forked_from == {"run_id": run.run_id, "checkpoint_id": checkpoint.checkpoint_id}
        assert (await client.cancel_run(fork.run_id)).status in ("cancelling", "cancelled")

        await _until_ended(client, sleeping.step_id)
        done = await client.complete_run(run.run_id, "succeeded", output={"ok": True})
        assert (done.status, done.output) == ("succeeded", {"ok": True})
        kinds = [e async for e in client.stream_run(run.run_id)]
        assert isinstance(kinds[-1], RunEndEvent) and kinds[-1].status == "succeeded"

        bundle = await client.export_run(run.run_id)
        assert (await client.import_run(bundle)).run_id == run.run_id  # already here: the same
        replay = await client.create_run(
            flow.flow_id, {"mode": "replay", "source_run_id": run.run_id}
        )
        assert (await client.replay_report(replay.run_id)).source_run_id == run.run_id

        pools = await client.list_pools()
        sim = pools[0]
        assert (await client.get_pool(sim.pool_id)).pool_id == sim.pool_id
        replica = sim.replicas[0].replica_id
        drained = await client.drain_replica(sim.pool_id, replica)
        assert drained.replicas[0].state == "draining"
        assert (await client.undrain_replica(sim.pool_id, replica)).replicas[0].state != "draining"
        spec = {
            "pool_id": "extra",
            "engine": "openai",
            "replicas": [{"replica_id": "r1", "url": "http://127.0.0.1:9/v1", "model": "m"}],
        }
        assert (await client.create_pool(spec)).pool_id == "extra"
        await client.delete_pool("extra")
        with pytest.raises(NotFound):
            await client.get_pool("extra")
        provisioned = await client.provision_pool({"pool_id": "made", "provisioner": "fake"})
        assert provisioned.pool_id == "made"
        await client.delete_pool("made")
    assert sent.routes == sdk_routes(), sorted(sdk_routes() - sent.routes)


async def _until_ended(client: AsyncClient, step_id: str) -> None:
    for _ in range(500):
        if (await client.get_step(step_id)).ended_at is not None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{step_id} did not end")


@pytest.fixture
def blocking(server_url: str) -> Iterator[tuple[Client, Sent]]:
    sent = Sent()
    with Client(server_url) as client:
        sent.wrap(client)
        yield client, sent


async def test_the_blocking_client_has_the_same_routes(
    blocking: tuple[Client, Sent],
) -> None:
    client, sent = blocking

    def tour() -> None:
        flow = client.create_flow({"ast": {"program": "blocking"}})
        run = client.create_run(flow.flow_id, {"seed": 3})
        step = client.run_step(run.run_id, steps.llm_call("Hi", max_tokens=4))
        assert (step.status, step.usage.tokens_out) == ("succeeded", 4)
        tokens = [e.t for e in client.stream_step(step.step_id) if isinstance(e, TokenEvent)]
        assert "".join(tokens) == (step.output or {})["text"]
        client.complete_run(run.run_id)
        assert isinstance(list(client.stream_run(run.run_id))[-1], RunEndEvent)
        assert client.get_run(run.run_id).status == "succeeded"

    await asyncio.to_thread(tour)
    assert {r for r, _ in sent.routes} == {"GET", "POST"}
    assert ("POST", "/v1/runs/{run_id}/steps") in sent.routes
    assert ("GET", "/v1/runs/{run_id}/stream") in sent.routes
