"""``POST /v1/runs/{id}/steps`` with ``Accept: text/event-stream``: the answer is the step's
stream, from its first event, on the submission's own request (one request per step where
a client would otherwise submit, then follow). The step is made as without it; the stream
is the one ``GET /v1/steps/{id}/stream`` sends."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from orchestrator_core.keys import Scope
from orchestratord.auth import store
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from orchestratord.steps.kinds import llm_call
from tests.conftest import make_settings
from tests.helpers import SseEvent, StreamsWatch, make_run, parse_sse, read_stream, wait_status

SSE = {"Accept": "text/event-stream"}


def _body(token: str, max_tokens: int = 5) -> dict[str, Any]:
    return {
        "type": "llm_call",
        "client_token": token,
        "input": {"prompt": "hello", "params": {"max_tokens": max_tokens}},
    }


async def _submit_streamed(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], accept: str = SSE["Accept"]
) -> tuple[httpx.Response, list[SseEvent]]:
    async with client.stream("POST", path, json=body, headers={"Accept": accept}) as r:
        text = (await r.aread()).decode()
    return r, parse_sse(text)[0] if r.headers["content-type"].startswith("text/") else []


async def _run_steps(client: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = (await client.get(f"/v1/runs/{run_id}/steps")).json()
    return steps


async def test_the_submission_answers_with_the_steps_stream(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    path = f"/v1/runs/{run_id}/steps"
    r, events = await _submit_streamed(live, path, _body("a"))
    assert r.status_code == 202
    assert r.headers["content-type"].startswith("text/event-stream")
    step_id = r.headers["x-step-id"]
    assert r.headers["location"] == f"/v1/steps/{step_id}/stream"
    kinds = [e.event for e in events]
    assert kinds[0] == "started" and kinds[-1] == "end"
    assert kinds.count("token") == 5
    assert [e.id for e in events] == [str(i) for i in range(len(events))]
    assert all(e.data is not None and e.data["step_id"] == step_id for e in events)
    # the same stream a follower reads, and the step as a JSON submission makes it
    assert await read_stream(live, f"/v1/steps/{step_id}/stream") == events
    assert (await live.get(f"/v1/steps/{step_id}")).json()["status"] == "succeeded"
    assert [s["step_id"] for s in await _run_steps(live, run_id)] == [step_id]


async def test_a_repeated_token_streams_the_first_step_again(live: httpx.AsyncClient) -> None:
    """The interpreter retries: the same client_token answers 200 with the first step's
    stream (its whole log once it has ended); the step ran once."""
    run_id = await make_run(live)
    path = f"/v1/runs/{run_id}/steps"
    first, events = await _submit_streamed(live, path, _body("a"))
    again, replayed = await _submit_streamed(live, path, _body("a"))
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.headers["x-step-id"] == first.headers["x-step-id"]
    assert replayed == events
    assert len(await _run_steps(live, run_id)) == 1


async def test_budget_headers_come_with_the_stream(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live, budgets={"max_tokens_out": 100})
    plain = await live.post(f"/v1/runs/{run_id}/steps", json=_body("a", 10))
    streamed, _ = await _submit_streamed(live, f"/v1/runs/{run_id}/steps", _body("b", 10))
    assert plain.headers["x-budget-tokens-remaining"] == "90"
    assert streamed.headers["x-budget-tokens-remaining"] == "80"


@pytest.mark.parametrize(
    "accept",
    ["text/event-stream", "TEXT/Event-Stream; q=1", "application/json;q=0.5, text/event-stream"],
)
async def test_accept_names_the_stream_in_any_of_its_forms(
    live: httpx.AsyncClient, accept: str
) -> None:
    run_id = await make_run(live)
    r, events = await _submit_streamed(live, f"/v1/runs/{run_id}/steps", _body("a"), accept)
    assert r.status_code == 202 and events[-1].event == "end"


@pytest.mark.parametrize("accept", ["application/json", "*/*", "text/*"])
async def test_other_accepts_get_the_json_answer(live: httpx.AsyncClient, accept: str) -> None:
    run_id = await make_run(live)
    r = await live.post(f"/v1/runs/{run_id}/steps", json=_body("a"), headers={"Accept": accept})
    assert r.status_code == 202 and r.headers["content-type"] == "application/json"
    assert set(r.json()) == {"step_id", "status"}


async def test_the_fastapi_route_streams_as_the_hot_route(
    live: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query string sends the request past the hot route, to FastAPI's: same answer."""
    # a metrics event goes out each METRICS_EVERY_S of a step's run: on a slow machine one
    # step would carry one and the other not
    monkeypatch.setattr(llm_call, "METRICS_EVERY_S", 3600.0)
    run_id = await make_run(live)
    hot, events = await _submit_streamed(live, f"/v1/runs/{run_id}/steps", _body("a"))
    routed, routed_events = await _submit_streamed(live, f"/v1/runs/{run_id}/steps?x=1", _body("b"))
    assert routed.status_code == hot.status_code == 202
    assert routed.headers["location"] == f"/v1/steps/{routed.headers['x-step-id']}/stream"
    assert [e.event for e in routed_events] == [e.event for e in events]


async def test_refusals_before_the_step_are_json_errors(live: httpx.AsyncClient) -> None:
    run_id = await make_run(live)
    missing, _ = await _submit_streamed(live, "/v1/runs/run_none/steps", _body("a"))
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"
    invalid, _ = await _submit_streamed(live, f"/v1/runs/{run_id}/steps", {"type": "llm_call"})
    assert invalid.status_code == 422
    assert invalid.json()["code"] == "INVALID_PARAMS"
    assert await _run_steps(live, run_id) == []


async def test_leaving_the_submissions_stream_cancels_as_leaving_any_stream(
    live: httpx.AsyncClient, orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cancel_on_disconnect holds for the stream a submission answers with: its client
    leaving mid-step cancels the step (and, without it, does not)."""
    orch.pools.pools["local"].replicas[0].adapter.tokens_per_s = 50.0  # type: ignore[attr-defined]
    streams = StreamsWatch(orch, monkeypatch)
    for cancels in (True, False):
        run_id = await make_run(live, cancel_on_disconnect=cancels)
        path = f"/v1/runs/{run_id}/steps"
        async with live.stream("POST", path, json=_body("a", 500), headers=SSE) as r:
            step_id = r.headers["x-step-id"]
            async for chunk in r.aiter_text():
                if "event: token" in chunk:
                    break
        if cancels:
            step = await wait_status(live, step_id, "cancelled")
            assert step["output"]["stop_reason"] == "cancelled"
        else:
            await streams.until(lambda: orch.hub.followers(step_id) == 0)  # noqa: B023
            assert (await live.get(f"/v1/steps/{step_id}")).json()["status"] == "running"
            await live.post(f"/v1/steps/{step_id}/cancel")


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(
        db_url,
        sim={"tokens_per_s": 20.0},
        auth={"cache_s": 0},
        limits={"max_followers_per_key": 1},
        stream={"max_followers": 2},
    )


async def test_a_stream_past_the_process_limit_makes_no_step(
    orch: Orchestrator, live: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream is admitted before the step is made: refused, nothing runs; a retry once a
    place is free gets its stream."""
    streams = StreamsWatch(orch, monkeypatch)
    run_id = await make_run(live)
    path = f"/v1/runs/{run_id}/steps"

    async def hold(token: str) -> None:
        async with live.stream("POST", path, json=_body(token, 200), headers=SSE) as r:
            async for _ in r.aiter_bytes():
                pass

    holders = [asyncio.create_task(hold(t)) for t in ("a", "b")]
    await streams.until(lambda: orch.hub.open_streams() == 2)
    refused, _ = await _submit_streamed(live, path, _body("c"))
    assert refused.status_code == 429
    assert refused.json()["details"]["limit"] == "stream.max_followers"
    assert sorted(s["client_token"] for s in await _run_steps(live, run_id)) == ["a", "b"]
    for task in holders:
        task.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    await streams.until(lambda: orch.hub.open_streams() == 0)
    retried, events = await _submit_streamed(live, path, _body("c"))
    assert retried.status_code == 202 and events[-1].event == "end"


async def test_a_keys_streams_count_the_submissions_streams(
    orch: Orchestrator, live: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = StreamsWatch(orch, monkeypatch)
    async with orch.db.write() as session:
        key = await store.create(session, scope=Scope.WRITE, name=None)
    live.headers["Authorization"] = f"Bearer {key}"
    key_id = key[3:15]
    run_id = await make_run(live)
    path = f"/v1/runs/{run_id}/steps"
    async with live.stream("POST", path, json=_body("a", 200), headers=SSE) as held:
        assert held.status_code == 202
        assert orch.key_streams.count(key_id) == 1
        refused, _ = await _submit_streamed(live, path, _body("b"))
        assert refused.status_code == 429
        assert refused.json()["details"]["limit"] == "limits.max_followers_per_key"
        # a submission refused after its stream was admitted gives its place back
        missing, _ = await _submit_streamed(live, "/v1/runs/run_none/steps", _body("c"))
        assert missing.status_code == 429  # still the key's limit: checked first
    await streams.until(lambda: orch.key_streams.count(key_id) == 0)
    missing, _ = await _submit_streamed(live, "/v1/runs/run_none/steps", _body("c"))
    assert missing.status_code == 404
    assert orch.key_streams.count(key_id) == 0
    ok, events = await _submit_streamed(live, path, _body("d"))
    assert ok.status_code == 202 and events[-1].event == "end"
    assert [s["client_token"] for s in await _run_steps(live, run_id)] == ["a", "d"]
