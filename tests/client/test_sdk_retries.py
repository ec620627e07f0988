"""Retries and errors through the SDK.

Refusals the server marks retriable are retried after the wait it asks for; others are
raised at once as typed errors carrying ``code``, ``retriable`` and ``details``. A write
whose answer is lost after the server stored it is sent again with the same
``client_token``, and the server answers the first record: nothing is stored twice.
(The lost answers and scripted refusals are fault injection around a real server or a
transport; the errors come from a real server.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.records import FactCreate
from orchestrator_client import (
    AsyncClient,
    Client,
    Conflict,
    Invalid,
    InvalidParams,
    InvalidRequest,
    NotFound,
    Retry,
    StepFailed,
    Unavailable,
    Unreachable,
    steps,
)
from orchestrator_client.errors import RateLimited, Unauthenticated

ERROR: dict[str, Any] = {"message": "busy", "details": {}, "retry_after_ms": None}


def scripted(*answers: httpx.Response) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    sent: list[httpx.Request] = []
    queue = list(answers)

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return queue.pop(0)

    return httpx.MockTransport(answer), sent


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr("orchestrator_client.transport.time.sleep", slept.append)
    return slept


def test_a_retriable_refusal_is_retried_after_the_wait_the_server_asks(
    waits: list[float],
) -> None:
    refused = {**ERROR, "code": "NO_CAPACITY", "retriable": True}
    transport, sent = scripted(
        httpx.Response(503, json=refused, headers={"Retry-After": "2"}),
        httpx.Response(429, json={**refused, "code": "ADMISSION_REJECT", "retry_after_ms": 1500}),
        httpx.Response(200, json={"status": "ok", "version": "x"}),
    )
    with Client("http://test", transport=transport) as client:
        assert client.healthz() == {"status": "ok", "version": "x"}
    assert len(sent) == 3 and waits == [2.0, 1.5]


def test_retries_stop_after_the_attempts_and_raise_the_last_refusal(waits: list[float]) -> None:
    refused = {**ERROR, "code": "POOL_UNAVAILABLE", "retriable": True, "retry_after_ms": 100}
    transport, sent = scripted(*(httpx.Response(503, json=refused) for _ in range(3)))
    with (
        Client("http://test", transport=transport, retry=Retry(attempts=3)) as client,
        pytest.raises(Unavailable) as caught,
    ):
        client.list_pools()
    assert len(sent) == 3 and waits == [0.1, 0.1]
    assert (caught.value.code, caught.value.retriable, caught.value.status) == (
        "POOL_UNAVAILABLE",
        True,
        503,
    )


def test_without_a_wait_named_the_backoff_doubles_within_its_bound(waits: list[float]) -> None:
    transport, _ = scripted(
        *(httpx.Response(502, text="bad gateway") for _ in range(4)),
        httpx.Response(200, json={"status": "ok"}),
    )
    retry = Retry(attempts=5, backoff_s=1.0, max_wait_s=3.0)
    with Client("http://test", transport=transport, retry=retry) as client:
        client.healthz()
    assert len(waits) == 4
    for attempt, wait in enumerate(waits):  # 0.5..1.5 times 1, 2, 4, 8 s, at most 3 s
        assert min(0.5 * 2**attempt, 3.0) <= wait <= min(1.5 * 2**attempt, 3.0)


def test_a_refusal_that_is_not_retriable_is_raised_at_once(waits: list[float]) -> None:
    body = {**ERROR, "code": "UNAUTHENTICATED", "retriable": False}
    transport, sent = scripted(httpx.Response(401, json=body))
    with Client("http://test", transport=transport) as client, pytest.raises(Unauthenticated):
        client.list_runs()
    assert len(sent) == 1 and waits == []


def test_the_error_class_follows_the_code_then_the_status() -> None:
    body = {**ERROR, "code": "LIMIT_EXCEEDED", "retriable": True, "retry_after_ms": 40}
    transport, _ = scripted(httpx.Response(429, json=body))
    with (
        Client("http://test", transport=transport, retry=Retry(attempts=1)) as client,
        pytest.raises(RateLimited) as caught,
    ):
        client.healthz()
    assert caught.value.retry_after_s == 0.04


class LoseAnswers(httpx.AsyncBaseTransport):
    """Sends each request to the server, and loses the answer of the first ``lose`` POSTs
    (as a connection reset after the server committed)."""

    def __init__(self, lose: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lose = lose
        self.posts: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST":
            self.posts.append(json.loads(request.content))
            if self.lose > 0:
                self.lose -= 1
                await response.aclose()
                raise httpx.ReadError("connection reset by peer", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


Write = Callable[[AsyncClient, str], Any]


@pytest.mark.parametrize(
    ("write", "listing"),
    [
        (lambda c, run: c.add_fact(run, {"type": "obs", "data": {"x": 1}}), "facts"),
        (lambda c, run: c.checkpoint(run, {"state": {"turn": 1}}), "checkpoints"),
        (lambda c, run: c.submit_step(run, steps.llm_call("hi", max_tokens=2)), "steps"),
    ],
    ids=["fact", "checkpoint", "step"],
)
async def test_a_write_whose_answer_was_lost_is_stored_once(
    server_url: str, write: Write, listing: str
) -> None:
    async with AsyncClient(server_url) as setup:
        flow = await setup.create_flow({"ast": {"program": "lost"}})
        run = await setup.create_run(flow.flow_id)
    lossy = LoseAnswers(lose=2)
    retry = Retry(backoff_s=0.01)
    async with AsyncClient(server_url, transport=lossy, retry=retry) as client:
        await write(client, run.run_id)
        stored = await getattr(client, f"list_{listing}")(run.run_id)
    assert len(lossy.posts) == 3  # the first try and two retries
    tokens = {post["client_token"] for post in lossy.posts}
    assert len(tokens) == 1 and None not in tokens
    assert len(stored) == 1


async def test_a_run_whose_answer_was_lost_is_created_once(server_url: str) -> None:
    async with AsyncClient(server_url) as setup:
        flow = await setup.create_flow({"ast": {"program": "lost-run"}})
    lossy = LoseAnswers(lose=1)
    async with AsyncClient(server_url, transport=lossy, retry=Retry(backoff_s=0.01)) as client:
        run = await client.create_run(flow.flow_id, {"seed": 4})
        assert [r.run_id for r in await client.list_runs(flow_id=flow.flow_id)] == [run.run_id]


async def test_a_server_that_stays_away_raises_unreachable(tmp_path: Path) -> None:
    retry = Retry(attempts=2, backoff_s=0.01)
    async with AsyncClient("http://127.0.0.1:9", retry=retry) as client:
        with pytest.raises(Unreachable) as caught:
            await client.healthz()
    assert caught.value.code == "UNREACHABLE" and caught.value.retriable


async def test_errors_are_typed_with_code_retriable_and_details(server_url: str) -> None:
    async with AsyncClient(server_url) as client:
        with pytest.raises(NotFound) as missing:
            await client.get_run("run_nope")
        assert (missing.value.code, missing.value.status, missing.value.retriable) == (
            "NOT_FOUND",
            404,
            False,
        )
        assert missing.value.correlation_id

        flow = await client.create_flow(
            {
                "ast": {"program": "errors"},
                "tools": [
                    {
                        "name": "nap",
                        "description": "sleeps",
                        "parameters": {"type": "object"},
                        "executor": {"kind": "builtin", "name": "sleep"},
                    }
                ],
            }
        )
        with pytest.raises(InvalidParams) as invalid:
            await client.create_run(flow.flow_id, {"mode": "replay"})
        assert invalid.value.field == "source_run_id"

        run = await client.create_run(flow.flow_id)
        fact = FactCreate(type="obs", data={"x": 1}, client_token="t1")
        await client.add_fact(run.run_id, fact)
        with pytest.raises(Conflict) as reused:
            await client.add_fact(run.run_id, fact.model_copy(update={"data": {"x": 2}}))
        assert reused.value.details["field"] == "client_token"

        with pytest.raises(StepFailed) as failed:
            await client.run_step(run.run_id, steps.tool_call("nap", {"ms": -1}))
        assert failed.value.code == "TOOL_ERROR" and failed.value.step_id.startswith("step")

        with pytest.raises(InvalidRequest) as local:  # checked before anything is sent
            await client.add_fact(run.run_id, {"type": "", "data": 1})
        assert (local.value.code, local.value.fields) == ("INVALID_PARAMS", ["type"])
        with pytest.raises(Invalid) as step:  # named as on the wire, not by the union's tag
            bad = {"type": "llm_call", "input": {"prompt": "x", "params": {"max_tokens": 0}}}
            await client.submit_step(run.run_id, bad)
        assert step.value.fields == ["input.params.max_tokens"]
