"""orchestratord in front of an OpenAI-compatible engine (the fake one, with faults)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from orchestrator_core import clock
from orchestratord.api.app import create_app
from orchestratord.pools.config import PoolSpec, ReplicaSpec
from orchestratord.pools.registry import build_registry
from orchestratord.runtime import Orchestrator
from test_harness.fake_openai import FakeState, Faults, create_fake_openai, fake_tokens
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import make_run, read_stream, submit, wait_status

SECRET = "sk-do-not-leak-1234"


@dataclass
class Rig:
    client: httpx.AsyncClient
    fake: FakeState
    orch: Orchestrator
    stop_fake: contextlib.AsyncExitStack


@pytest.fixture
async def rig(db_url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    fake = FakeState()
    fake_stack = contextlib.AsyncExitStack()
    fake_url = await fake_stack.enter_async_context(serve_app(create_fake_openai(fake)))
    prices = tmp_path / "prices"
    prices.mkdir()
    (prices / "2026-01-01.yaml").write_text(
        'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        "  - {engine: openai, model: fake-model, input_per_million_usd: 1.0,"
        " output_per_million_usd: 2.0}\n"
    )
    settings = make_settings(db_url, price_tables_dir=prices)
    spec = PoolSpec(
        pool_id="gpu",
        engine="openai",
        tags={"gpu": "h100"},
        replicas=[
            ReplicaSpec(
                replica_id="v1",
                url=f"{fake_url}/v1",
                model="fake-model",
                slots=2,
                options={"api_key": SECRET, "read_timeout_s": 1.0},
            )
        ],
    )
    orch = Orchestrator(settings, pools=build_registry([spec], settings))
    await orch.start()
    async with (
        serve_app(create_app(orchestrator=orch)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        yield Rig(client, fake, orch, fake_stack)
    await orch.stop()
    await fake_stack.aclose()


async def test_text_equals_the_engine(rig: Rig) -> None:
    run_id = await make_run(rig.client, seed=11)
    step_id = (await submit(rig.client, run_id, prompt="p", max_tokens=20, temperature=0.0)).json()[
        "step_id"
    ]
    step = await wait_status(rig.client, step_id, "succeeded")
    assert step["output"]["text"] == "".join(fake_tokens(rig.fake.requests[0]))
    assert rig.fake.requests[0]["seed"] == 11
    prov = step["provenance"]
    assert prov["engine"] == "openai" and prov["pool_id"] == "gpu" and prov["replica_id"] == "v1"
    assert prov["tokens_out"] == 20


@pytest.mark.parametrize(
    ("faults", "code", "retriable", "tokens_before"),
    [
        (Faults(status=500), "ENGINE_ERROR", True, 0),
        (Faults(status=400), "ENGINE_ERROR", False, 0),
        (Faults(cut_after=4), "ENGINE_ERROR", True, 4),
        (Faults(malformed_at=3), "ENGINE_ERROR", True, 3),
        (Faults(first_byte_delay_s=3.0), "ENGINE_ERROR", True, 0),
    ],
)
async def test_faults_end_in_typed_errors(
    rig: Rig, faults: Faults, code: str, retriable: bool, tokens_before: int
) -> None:
    rig.fake.faults = faults
    run_id = await make_run(rig.client)
    step_id = (await submit(rig.client, run_id, max_tokens=10)).json()["step_id"]
    step = await wait_status(rig.client, step_id, "failed")
    events = await read_stream(rig.client, f"/v1/steps/{step_id}/stream")
    assert [e.id for e in events] == [str(i) for i in range(len(events))]
    assert [e.event for e in events[:2]] == ["started", "narration"]  # where it was placed
    assert [e.event for e in events[2:-1]] == ["token"] * tokens_before
    err = events[-1]
    assert err.event == "error" and err.data is not None
    assert err.data["code"] == code and err.data["retriable"] is retriable
    assert step["error"]["code"] == code
    assert step["output"]["text"] == "".join(
        e.data["t"] for e in events if e.event == "token" and e.data
    )
    run = (await rig.client.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["tokens_out"] == tokens_before


async def test_engine_gone_is_pool_unavailable(rig: Rig) -> None:
    await rig.stop_fake.aclose()  # the engine dies after its health check
    run_id = await make_run(rig.client)
    step_id = (await submit(rig.client, run_id)).json()["step_id"]
    step = await wait_status(rig.client, step_id, "failed")
    assert step["error"]["code"] == "POOL_UNAVAILABLE"
    assert step["error"]["retriable"] is True
    await rig.orch.pools.refresh()
    pools = (await rig.client.get("/v1/pools")).json()
    assert pools[0]["health"] == "down"
    r = await submit(rig.client, run_id, token="after")
    assert r.status_code == 503
    assert r.json()["code"] == "POOL_UNAVAILABLE" and r.json()["retriable"] is True
    assert "Retry-After" in r.headers


async def test_cancel_frees_the_upstream_slot(rig: Rig) -> None:
    rig.fake.faults = Faults(token_delay_s=0.05)
    run_id = await make_run(rig.client)
    step_id = (await submit(rig.client, run_id, max_tokens=500)).json()["step_id"]
    for _ in range(200):
        if rig.fake.active == 1:
            break
        await asyncio.sleep(0.01)
    assert rig.fake.active == 1
    await rig.client.post(f"/v1/steps/{step_id}/cancel")
    step = await wait_status(rig.client, step_id, "cancelled")
    for _ in range(200):
        if rig.fake.active == 0:
            break
        await asyncio.sleep(0.01)
    assert rig.fake.active == 0
    assert rig.fake.disconnects == 1
    assert step["output"]["stop_reason"] == "cancelled"


async def test_pool_view_and_no_key_anywhere(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    pools = (await rig.client.get("/v1/pools")).json()
    assert pools[0]["capabilities"]["model"] == "fake-model"
    assert pools[0]["tags"] == {"gpu": "h100"}
    assert pools[0]["load"]["slots_free"] == 2
    rig.fake.faults = Faults(status=500)
    run_id = await make_run(rig.client)
    step_id = (await submit(rig.client, run_id)).json()["step_id"]
    await wait_status(rig.client, step_id, "failed")
    body = (await rig.client.get(f"/v1/steps/{step_id}/stream")).text
    assert SECRET not in body
    assert SECRET not in str(pools)
    assert SECRET not in caplog.text
    assert rig.fake.auth_headers[0] == f"Bearer {SECRET}"


async def test_a_failing_replica_opens_its_breaker_then_recovers(
    rig: Rig, skewed: clock.SkewedClock
) -> None:
    from orchestrator_core.breakers import BreakerBoard, BreakerConfig

    rig.orch.services.engine_breakers = BreakerBoard(
        BreakerConfig(failure_threshold=2, open_s=60, half_open_max_calls=1)
    )
    run_id = await make_run(rig.client)
    rig.fake.faults = Faults(status=500)
    failed = []
    for i in range(2):
        step_id = (await submit(rig.client, run_id, token=f"f{i}")).json()["step_id"]
        failed.append(await wait_status(rig.client, step_id, "failed"))
    assert [s["error"]["code"] for s in failed] == ["ENGINE_ERROR", "ENGINE_ERROR"]
    events = await read_stream(rig.client, f"/v1/steps/{failed[1]['step_id']}/stream")
    escalations = [e.data for e in events if e.event == "escalation" and e.data]
    assert len(escalations) == 1
    assert {k: escalations[0][k] for k in ("target", "state", "failures")} == {
        "target": "replica:gpu/v1",
        "state": "open",
        "failures": 2,
    }
    assert escalations[0]["reason"]
    sent = len(rig.fake.requests)
    step_id = (await submit(rig.client, run_id, token="fast")).json()["step_id"]
    fast = await wait_status(rig.client, step_id, "failed")
    assert fast["error"]["code"] == "CIRCUIT_OPEN"
    assert fast["error"]["retriable"] is True and fast["error"]["retry_after_ms"] > 0
    assert len(rig.fake.requests) == sent  # failed fast: the engine was not asked
    rig.fake.faults = Faults()
    skewed.advance(61)  # past the breaker's open_s (60)
    step_id = (await submit(rig.client, run_id, token="trial")).json()["step_id"]
    await wait_status(rig.client, step_id, "succeeded")
    events = await read_stream(rig.client, f"/v1/steps/{step_id}/stream")
    states = [e.data["state"] for e in events if e.event == "escalation" and e.data]
    assert states == ["half_open", "closed"]
