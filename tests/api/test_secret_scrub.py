"""Credentials stay out of what the service shows, logs and records: replica URLs with a user
and password or a key in the query, the pools' API keys, and an engine error quoting them."""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator_core.secrets import Scrubber, url_secrets
from orchestratord.api.app import create_app
from orchestratord.pools.config import PoolSpec, ReplicaSpec
from orchestratord.pools.registry import build_registry
from orchestratord.runtime import Orchestrator
from test_harness.fake_openai import FakeState, create_fake_openai
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import make_run, read_stream, wait_status

PASSWORD = "pw-Hunter2-rotate-me"
API_KEY = "sk-live-0123456789abcdef"
ECHO_KEY = "sk-echoed-fedcba9876543210"
QUERY_KEY = "qk-in-the-query-555"
TOKEN_USER = "ghp-token-as-user-777"
ALL_SECRETS = (PASSWORD, API_KEY, ECHO_KEY, QUERY_KEY, TOKEN_USER)


def echoing(app: ASGIApp) -> ASGIApp:
    """The fake engine, except that a generation is refused with a 500 whose body quotes
    the request's Authorization header, as some gateways do."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/completions"):
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            reply = JSONResponse(
                {"error": {"message": f"upstream rejected the request ({auth})"}},
                status_code=500,
            )
            await reply(scope, receive, send)
            return
        await app(scope, receive, send)

    return asgi


@dataclass
class Rig:
    client: httpx.AsyncClient
    orch: Orchestrator
    fake: FakeState
    fake_url: str
    echo_url: str


@pytest.fixture
async def rig(db_url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    fake = FakeState()
    async with contextlib.AsyncExitStack() as stack:
        fake_url = await stack.enter_async_context(serve_app(create_fake_openai(fake)))
        echo_url = await stack.enter_async_context(
            serve_app(echoing(create_fake_openai(FakeState())))
        )
        prices = tmp_path / "prices"
        prices.mkdir()
        (prices / "2026-01-01.yaml").write_text(
            'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
            "  - {engine: openai, model: fake-model, input_per_million_usd: 1.0,"
            " output_per_million_usd: 2.0}\n  - {engine: sim, model: '*', free: true}\n"
        )
        settings = make_settings(db_url, price_tables_dir=prices, breakers={"engine_failures": 1})
        host = fake_url.removeprefix("http://")
        specs = [
            PoolSpec(
                pool_id="gpu",
                engine="openai",
                replicas=[
                    ReplicaSpec(
                        replica_id="v1",
                        url=f"http://alice:{PASSWORD}@{host}/v1",
                        model="fake-model",
                        options={"api_key": API_KEY},
                    )
                ],
            ),
            PoolSpec(
                pool_id="echo",
                engine="openai",
                replicas=[
                    ReplicaSpec(
                        replica_id="e1",
                        url=f"{echo_url}/v1",
                        model="fake-model",
                        options={"api_key": ECHO_KEY},
                    )
                ],
            ),
            PoolSpec(
                pool_id="listed",
                engine="sim",
                replicas=[
                    ReplicaSpec(
                        replica_id="s1",
                        url=f"https://svc:{PASSWORD}@models.example/v1?api_key={QUERY_KEY}&region=eu",
                    ),
                    ReplicaSpec(replica_id="s2", url=f"https://{TOKEN_USER}@models.example/v1"),
                ],
            ),
        ]
        orch = Orchestrator(settings, pools=build_registry(specs, settings))
        await orch.start()
        try:
            async with (
                serve_app(create_app(orchestrator=orch)) as url,
                httpx.AsyncClient(base_url=url, timeout=30) as client,
            ):
                yield Rig(client, orch, fake, fake_url, echo_url)
        finally:
            await orch.stop()


def assert_clean(text: str) -> None:
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    for secret in (*ALL_SECRETS, basic):
        assert secret not in text


async def pinned_step(client: httpx.AsyncClient, run_id: str, pool: str, token: str) -> str:
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={
            "type": "llm_call",
            "client_token": token,
            "input": {"prompt": "hello", "params": {"max_tokens": 6}},
            "placement": {"pin": pool},
        },
    )
    assert r.status_code == 202, r.text
    step_id: str = r.json()["step_id"]
    return step_id


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pass@host/v1", "https://***@host/v1"),
        ("https://token@host:8443/", "https://***@host:8443/"),
        ("http://host/v1?api_key=abc&region=eu", "http://host/v1?api_key=***&region=eu"),
        ("http://host/v1?access_token=abc&X-Amz-Signature=def", "http://host/v1?access_token=***&X-Amz-Signature=***"),
        ("http://host/v1?keyword=abc&monkey=1", "http://host/v1?keyword=abc&monkey=1"),
        ("127.0.0.1:50051", "127.0.0.1:50051"),
        ("unix:///run/uma.sock", "unix:///run/uma.sock"),
    ],
)  # fmt: skip
def test_urls_are_shown_without_their_credentials(url: str, shown: str) -> None:
    assert Scrubber(url_secrets(url)).url(url) == shown


def test_configured_secrets_are_masked_in_text_and_json() -> None:
    scrubber = Scrubber([API_KEY, *url_secrets(f"http://alice:{PASSWORD}@h/v1")])
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    body = {
        "message": f"denied: Bearer {API_KEY}; Basic {basic}; password {PASSWORD}",
        "details": {"echo": [API_KEY, 3]},
    }
    clean = scrubber.value(body)
    assert clean == {
        "message": "denied: Bearer ***; Basic ***; password ***",
        "details": {"echo": ["***", 3]},
    }
    assert "sk-" not in repr(scrubber)
    assert scrubber.value({"clean": "nothing to hide"}) == {"clean": "nothing to hide"}


async def test_pool_listings_show_no_credentials(rig: Rig) -> None:
    listing = await rig.client.get("/v1/pools")
    assert listing.status_code == 200
    assert_clean(listing.text)
    pools = {p["pool_id"]: p for p in listing.json()}
    host = rig.fake_url.removeprefix("http://")
    assert pools["gpu"]["replicas"][0]["url"] == f"http://***@{host}/v1"
    assert pools["gpu"]["capabilities"]["base_url"] == f"http://***@{host}/v1"
    listed = [r["url"] for r in pools["listed"]["replicas"]]
    assert listed == [
        "https://***@models.example/v1?api_key=***&region=eu",
        "https://***@models.example/v1",
    ]
    one = await rig.client.get("/v1/pools/listed")
    assert one.status_code == 200
    assert one.json() == pools["listed"]


async def test_logs_carry_no_credentials(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    run_id = await make_run(rig.client, seed=3)
    step_id = await pinned_step(rig.client, run_id, "gpu", "ok")
    step = await wait_status(rig.client, step_id, "succeeded", "failed")
    assert step["status"] == "succeeded", step["error"]
    failed = await wait_status(
        rig.client, await pinned_step(rig.client, run_id, "echo", "echo"), "failed"
    )
    assert failed["error"]["code"] == "ENGINE_ERROR"
    host = rig.fake_url.removeprefix("http://")
    requests = [r.getMessage() for r in caplog.records if r.name == "worker_adapters.http1"]
    # the engine was called, and its request line shows the URL without the password
    assert f"POST http://{host}/v1/completions -> 200" in requests, requests
    names = {r.name.split(".")[0] for r in caplog.records}
    assert {"worker_adapters", "orchestratord"} <= names
    assert_clean(caplog.text)
    for record in caplog.records:
        assert_clean(record.getMessage())
        assert_clean(orjson.dumps(record.__dict__, default=str).decode())


async def test_an_engine_error_quoting_the_key_is_scrubbed_everywhere(rig: Rig) -> None:
    run_id = await make_run(rig.client, seed=4)
    step_id = await pinned_step(rig.client, run_id, "echo", "e")
    step = await wait_status(rig.client, step_id, "failed")
    assert step["error"]["code"] == "ENGINE_ERROR"  # the engine quoted the key: masked there
    assert "(Bearer ***)" in step["error"]["message"], step["error"]["message"]
    assert_clean(orjson.dumps(step).decode())

    events = await read_stream(rig.client, f"/v1/steps/{step_id}/stream")
    error = next(e.data for e in events if e.event == "error")
    assert error is not None and error["message"] == step["error"]["message"]
    # the replica's breaker opened on that failure: its reason quotes the error, masked
    escalation: dict[str, Any] | None = next(
        (e.data for e in events if e.event == "escalation"), None
    )
    assert escalation is not None and "Bearer ***" in escalation["reason"]
    assert_clean(str([e.data for e in events]))

    done = await rig.client.post(f"/v1/runs/{run_id}/complete", json={"status": "failed"})
    assert done.status_code == 200, done.text
    run_events = await read_stream(rig.client, f"/v1/runs/{run_id}/stream")
    assert [e.event for e in run_events][-1] == "run_end"
    assert_clean(str([e.data for e in run_events]))
    exported = await rig.client.get(f"/v1/runs/{run_id}/export")
    assert exported.status_code == 200
    assert_clean(exported.text)
    assert "Bearer ***" in exported.text
    # masked alike in the event and the step's row, the record still agrees with itself
    again = await rig.client.post("/v1/runs:import", json=exported.json())
    assert again.status_code == 200, again.text
