"""The Evergreen adapter against the reference Evergreen server over localhost gRPC, and an
Evergreen pool serving a run's steps through orchestratord."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from orchestratord.evergreen.nodes import Limits
from test_harness.evergreen_runtime import RunningEvergreen, make_engine, serve_evergreen
from tests.helpers import make_run, submit, wait_status
from tests.pools.test_session_engines import served_pool
from worker_adapters import AdapterError, EngineFailure, EngineUnavailable, GenerationRequest
from worker_adapters.base import Finish, Token
from worker_adapters.evergreen import MAX_NESTING, EvergreenAdapter
from worker_adapters.registry import EngineDefaults, ReplicaConfig, variant
from worker_adapters.session_handle import EngineSession

FIRST = "plan step tool call fact gate run flow seed token stream replay model pool " * 40


@pytest.fixture
async def server() -> AsyncIterator[RunningEvergreen]:
    async with serve_evergreen() as srv:
        yield srv


@pytest.fixture
async def adapter(server: RunningEvergreen) -> AsyncIterator[EvergreenAdapter]:
    adapter = EvergreenAdapter(target=server.address, model="sim-1")
    yield adapter
    await adapter.aclose()


def req(prompt: str | None = FIRST, **kw: Any) -> GenerationRequest:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "prompt": prompt,
        "messages": None,
        "seed": 7,
        "max_tokens": 12,
    }
    fields.update(kw)
    return GenerationRequest(**fields)


async def run(adapter: EvergreenAdapter, request: GenerationRequest) -> tuple[str, Finish]:
    events = [e async for e in adapter.stream(request)]
    *tokens, finish = events
    assert isinstance(finish, Finish), events[-1:]
    assert all(isinstance(t, Token) and t.token_id is None for t in tokens)
    assert finish.tokens_out == len(tokens)
    return "".join(t.text for t in tokens if isinstance(t, Token)), finish


async def engine_text(server: RunningEvergreen, request: GenerationRequest) -> str:
    """What the server's engine (the sim unless told) makes of ``request`` when asked
    directly."""
    events = [e async for e in server.engine.stream(request)]
    return "".join(e.text for e in events if isinstance(e, Token))


async def sim_finish(server: RunningEvergreen, request: GenerationRequest) -> Finish:
    *_, finish = [e async for e in server.engine.stream(request)]
    assert isinstance(finish, Finish)
    return finish


async def resent(server: RunningEvergreen, request: GenerationRequest) -> int:
    """Bytes of the message that sends ``request`` whole (on a session of its own)."""
    adapter = EvergreenAdapter(target=server.address, model="sim-1")
    try:
        await run(adapter, request)
    finally:
        await adapter.aclose()
    return server.sessions[-1].received[0]


async def until(check: Any, what: str) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_second_turn_names_the_first_turn_s_nodes_and_sends_only_its_new_text(
    server: RunningEvergreen, adapter: EvergreenAdapter
) -> None:
    session = adapter.open_session()
    first, finish = await run(adapter, req(session=session))
    assert first == await engine_text(server, req())
    sim = await sim_finish(server, req())
    assert (finish.stop_reason, finish.tokens_out) == (sim.stop_reason, sim.tokens_out)
    second_prompt = FIRST + first + "alpha beta "
    second, _ = await run(adapter, req(second_prompt, session=session))

    assert second == await engine_text(server, req(second_prompt))
    assert server.counters.sessions_opened == 1 and server.counters.actions_run == 2
    (served,) = server.sessions
    # the server read the whole conversation for turn 2 ...
    assert [r.prompt for r in served.requests] == [FIRST, second_prompt]
    # ... from a message that carried the new text and ids, not the conversation again
    turn1, turn2 = served.received
    assert turn1 > len(FIRST.encode())
    assert served.ended is None  # kept open for the run's next step
    assert turn2 < await resent(server, req(second_prompt)) / 10

    await adapter.close_session(session)
    await until(lambda: served.ended == "ok", "the session to end")
    assert session.session_id is None


async def test_a_chat_sends_new_messages_with_their_roles_and_names_the_reply(
    server: RunningEvergreen, adapter: EvergreenAdapter
) -> None:
    session = adapter.open_session()
    system = {"role": "system", "content": "answer in words of the plan " * 100}
    opening = (system, {"role": "user", "content": "what is the plan?"})
    reply, _ = await run(adapter, req(None, messages=opening, session=session))
    assert reply == await engine_text(server, req(None, messages=opening))
    follow = (*opening, {"role": "assistant", "content": reply}, {"role": "user", "content": "go"})
    again, _ = await run(adapter, req(None, messages=follow, session=session))

    assert again == await engine_text(server, req(None, messages=follow))
    (served,) = server.sessions
    assert served.requests[1].messages == follow  # the reply, read back as the assistant's
    assert served.received[1] < await resent(server, req(None, messages=follow)) / 10


async def test_a_prompt_that_rewrites_the_past_gets_a_new_session_sent_whole(
    server: RunningEvergreen, adapter: EvergreenAdapter
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    other = "gamma delta " * 10
    text, _ = await run(adapter, req(other, session=session))

    assert text == await engine_text(server, req(other))
    assert server.counters.sessions_opened == 2 and session.rebuilds == 1
    first, second = server.sessions
    assert first.ended == "ok"  # closed by the adapter, not left behind
    assert second.received[0] > len(other)


async def test_step_parameters_reach_the_server_in_the_generate_config(
    server: RunningEvergreen, adapter: EvergreenAdapter
) -> None:
    request = req(temperature=0.7, top_p=0.9, top_k=5, max_tokens=9, stop=("zzz",))
    text, _ = await run(adapter, request)
    (served,) = server.sessions
    (got,) = served.requests
    assert (got.temperature, got.top_p, got.top_k, got.max_tokens, got.seed, got.stop) == (
        0.7,
        0.9,
        5,
        9,
        7,
        ("zzz",),
    )
    assert text == await engine_text(server, request)
    assert served.ended == "ok"  # a request without the run's session: a one-shot session


async def test_a_stop_string_ends_the_response_without_it(
    server: RunningEvergreen, adapter: EvergreenAdapter
) -> None:
    # a stop string the sim meets (its tokens depend on the stop strings asked for)
    met = [
        word
        for word in ("the", "of", "and", "to", "plan", "step")
        if (await sim_finish(server, req(max_tokens=30, stop=(word,)))).stop_reason == "stop"
    ]
    stop = met[0]
    text, finish = await run(adapter, req(max_tokens=30, stop=(stop,)))
    assert text == await engine_text(server, req(max_tokens=30, stop=(stop,)))
    assert stop not in text
    assert finish.stop_reason == "eos"  # the server stopped there; the protocol says no more


async def test_the_seed_is_sent_only_when_the_options_say_so(server: RunningEvergreen) -> None:
    built = variant("evergreen").adapter_for(
        ReplicaConfig("r1", f"grpc://{server.address}", server.address, "sim-1", 1),
        {"seed": False},
        EngineDefaults(),
    )
    assert isinstance(built, EvergreenAdapter)
    try:
        caps = await built.capabilities()
        assert "seed" not in caps.features and "sessions" in caps.features
        await run(built, req())
    finally:
        await built.aclose()
    (served,) = server.sessions
    assert served.requests[0].seed != 7  # the server drew its own
    seeded = EvergreenAdapter(target=server.address, model="sim-1")
    assert "seed" in (await seeded.capabilities()).features


async def test_the_target_option_is_the_actions_target_spec(server: RunningEvergreen) -> None:
    known = EvergreenAdapter(target=server.address, model="sim-1", target_id="sim-1")
    unknown = EvergreenAdapter(target=server.address, model="other", target_id="other")
    try:
        assert (await run(known, req()))[0] == await engine_text(server, req())
        with pytest.raises(EngineFailure, match="NOT_FOUND: unknown target 'other'") as caught:
            await run(unknown, req())
        assert caught.value.retriable is False
    finally:
        await known.aclose()
        await unknown.aclose()


async def test_cancel_stops_the_server_s_generation_and_the_next_step_opens_a_new_session(
    server: RunningEvergreen, adapter: EvergreenAdapter
) -> None:
    held = server.faults.hold(after_tokens=3)
    session = adapter.open_session()
    got: list[Any] = []

    async def consume() -> None:
        async for event in adapter.stream(req(session=session, request_id="c1")):
            got.append(event)

    task = asyncio.create_task(consume())
    await until(lambda: len(got) == 3, "three tokens")
    await adapter.cancel("c1")
    await asyncio.wait_for(task, 5)

    assert not any(isinstance(e, Finish) for e in got)  # the stream just ended
    await until(lambda: server.counters.cancelled == 1, "the server to see the cancel")
    assert server.sessions[0].ended == "cancelled" and server.sessions[0].actions == 0
    held.set()
    text, _ = await run(adapter, req(session=session, request_id="c2"))
    assert text == await engine_text(server, req())
    assert server.counters.sessions_opened == 2 and server.counters.actions_run == 1
    assert session.rebuilds == 1


async def test_closing_the_stream_mid_response_cancels_the_call(
    server: RunningEvergreen, adapter: EvergreenAdapter
) -> None:
    server.faults.hold(after_tokens=2)
    session = adapter.open_session()
    stream = adapter.stream(req(session=session))
    assert isinstance(await anext(stream), Token)
    await stream.aclose()  # type: ignore[attr-defined]
    await until(lambda: server.counters.cancelled == 1, "the server to see the cancel")


async def test_a_server_that_is_gone_is_a_retriable_unavailable_error(
    server: RunningEvergreen, adapter: EvergreenAdapter
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    await server.stop()
    with pytest.raises(EngineUnavailable) as caught:
        await run(adapter, req(FIRST + "more ", session=session))
    assert caught.value.retriable is True
    health = await adapter.health()
    assert (health.live, health.ready) == (False, False)


async def test_nothing_listening_is_unavailable_and_unhealthy() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    adapter = EvergreenAdapter(target=f"127.0.0.1:{port}", model="m", connect_timeout_s=2)
    try:
        with pytest.raises(EngineUnavailable, match="cannot be reached"):
            await run(adapter, req())
        assert (await adapter.health()).live is False
    finally:
        await adapter.aclose()


@pytest.mark.parametrize(
    ("code", "error", "retriable"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, AdapterError, True),
        (grpc.StatusCode.UNAVAILABLE, EngineUnavailable, True),
        (grpc.StatusCode.INTERNAL, EngineFailure, False),
    ],
)
async def test_a_session_the_server_aborts_mid_stream_is_an_error_with_its_status(
    server: RunningEvergreen,
    adapter: EvergreenAdapter,
    code: grpc.StatusCode,
    error: type[AdapterError],
    retriable: bool,
) -> None:
    session = adapter.open_session()
    first, _ = await run(adapter, req(session=session))
    server.faults.abort_after(2, code)
    got: list[Any] = []
    prompt = FIRST + first + "again "
    with pytest.raises(error, match=f"{code.name}: injected {code.name} after 2 tokens") as caught:
        async for event in adapter.stream(req(prompt, session=session)):
            got.append(event)
    assert caught.value.retriable is retriable
    assert len(got) == 2 and server.sessions[0].ended == f"aborted {code.name}"
    # the session is gone: the next step opens another, sent whole
    text, _ = await run(adapter, req(prompt, session=session))
    assert text == await engine_text(server, req(prompt))
    assert server.counters.sessions_opened == 2 and session.rebuilds == 1


async def test_a_session_the_server_ended_while_idle_is_replaced() -> None:
    async with serve_evergreen(idle_ttl_s=0.05) as server:
        adapter = EvergreenAdapter(target=server.address, model="sim-1")
        try:
            session = adapter.open_session()
            first, _ = await run(adapter, req(session=session))
            await until(lambda: server.sessions[0].ended is not None, "the server to evict")
            assert server.sessions[0].ended == "aborted DEADLINE_EXCEEDED"
            prompt = FIRST + first + "next "
            text, _ = await run(adapter, req(prompt, session=session))
        finally:
            await adapter.aclose()
        assert text == await engine_text(server, req(prompt))
        assert server.counters.sessions_opened == 2


async def test_an_idle_session_is_closed_by_the_adapter(server: RunningEvergreen) -> None:
    adapter = EvergreenAdapter(target=server.address, model="sim-1", idle_close_s=0.05)
    try:
        session = adapter.open_session()
        first, _ = await run(adapter, req(session=session))
        await until(lambda: server.sessions[0].ended == "ok", "the adapter to close it")
        text, _ = await run(adapter, req(FIRST + first + "next ", session=session))
    finally:
        await adapter.aclose()
    assert text == await engine_text(server, req(FIRST + first + "next "))
    assert server.counters.sessions_opened == 2 and session.rebuilds == 1


async def test_a_long_conversation_stays_within_the_server_s_nesting_limit() -> None:
    turns = MAX_NESTING + 4
    async with serve_evergreen(limits=Limits(max_depth=MAX_NESTING + 2)) as server:
        adapter = EvergreenAdapter(target=server.address, model="sim-1")
        try:
            session = adapter.open_session()
            prompt = "alpha "
            for _ in range(turns):
                text, _ = await run(adapter, req(prompt, session=session, max_tokens=2))
                prompt += text + "beta "
        finally:
            await adapter.aclose()
    (served,) = server.sessions
    assert served.actions == turns
    assert served.requests[-1].prompt == prompt.removesuffix(text + "beta ")


async def test_a_run_s_steps_through_orchestratord_share_one_evergreen_session(
    tmp_path: Path,
) -> None:
    async with serve_evergreen() as server:
        url = f"grpc://{server.address}"
        async with served_pool("evergreen", tmp_path, url, {}) as client:
            (pool,) = (await client.get("/v1/pools")).json()
            run_id = await make_run(client, seed=5)
            prompt = FIRST
            for turn in range(2):
                step_id = (await submit(client, run_id, f"t{turn}", prompt, max_tokens=8)).json()[
                    "step_id"
                ]
                step = await wait_status(client, step_id, "succeeded", "failed")
                assert step["status"] == "succeeded", step.get("error")
                expected = await engine_text(server, req(prompt, seed=5, max_tokens=8))
                assert step["output"]["text"] == expected
                prompt += step["output"]["text"] + "gamma delta "
            (served,) = server.sessions  # one engine session for the run's two steps
            assert server.counters.actions_run == 2 and served.received[1] < len(prompt) / 10
            r = await client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
            assert r.status_code == 200, r.text
            await until(lambda: served.ended == "ok", "the run's end to close its session")
    assert pool["health"] == "ready" and pool["capabilities"]["engine"] == "evergreen"


async def test_another_protocol_s_session_is_refused() -> None:
    session = EngineSession(protocol="kakeya", replica="x")
    adapter = EvergreenAdapter(target="127.0.0.1:1", model="m")
    with pytest.raises(EngineFailure, match="a kakeya session cannot be used"):
        await run(adapter, req(session=session))


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed"
)
async def test_the_server_runs_the_packaged_model_too() -> None:
    async with serve_evergreen(engine=make_engine("llama"), model="gemma-3-270m") as server:
        adapter = EvergreenAdapter(target=server.address, model="gemma-3-270m")
        try:
            session = adapter.open_session()
            opening = ({"role": "user", "content": "Name a colour."},)
            reply, _ = await run(adapter, req(None, messages=opening, session=session))
            follow = (
                *opening,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "And another?"},
            )
            again, _ = await run(adapter, req(None, messages=follow, session=session))
        finally:
            await adapter.aclose()
        assert reply and reply == await engine_text(server, req(None, messages=opening))
        assert again == await engine_text(server, req(None, messages=follow))
        assert server.counters.sessions_opened == 1
