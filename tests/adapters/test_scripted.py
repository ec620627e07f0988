"""The scripted fake adapter (worker_adapters.scripted)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import pytest

from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable
from worker_adapters.scripted import Delay, ScriptedAdapter, ScriptItem

SCRIPT: list[ScriptItem] = [
    Token("Hel", token_id=1),
    Token("lo", token_id=2, logprob=-0.5),
    Finish(stop_reason="eos", tokens_in=3, tokens_out=2),
]


def req(request_id: str = "r1", **overrides: Any) -> GenerationRequest:
    fields: dict[str, Any] = {
        "request_id": request_id,
        "prompt": "hi",
        "messages": None,
        "seed": 1,
        "max_tokens": 8,
    }
    fields.update(overrides)
    return GenerationRequest(**fields)


def open_stream(adapter: ScriptedAdapter, request: GenerationRequest) -> AsyncGenerator[Any, None]:
    return cast(AsyncGenerator[AdapterEvent, None], adapter.stream(request))


async def collect(adapter: WorkerAdapter, request: GenerationRequest) -> list[AdapterEvent]:
    return [event async for event in adapter.stream(request)]


async def drain(stream: AsyncIterator[AdapterEvent], into: list[AdapterEvent]) -> None:
    async for event in stream:
        into.append(event)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float, result: Any = None) -> Any:
        recorded.append(delay)
        return await real_sleep(0, result)  # keep the test fast whatever the script says

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    return recorded


# --- playback ----------------------------------------------------------------------------------


async def test_plays_the_script_in_order() -> None:
    adapter = ScriptedAdapter(SCRIPT)
    events = await collect(adapter, req())
    assert events == SCRIPT
    assert events[1] == Token("lo", token_id=2, logprob=-0.5)


async def test_script_is_replayed_for_every_stream() -> None:
    adapter = ScriptedAdapter(SCRIPT)
    assert await collect(adapter, req("a")) == SCRIPT
    assert await collect(adapter, req("b")) == SCRIPT
    assert [r.request_id for r in adapter.requests] == ["a", "b"]
    assert adapter.closed_streams == 2


async def test_script_is_copied() -> None:
    script: list[Any] = [Token("a")]
    adapter = ScriptedAdapter(script)
    script.append(Token("b"))
    assert await collect(adapter, req()) == [Token("a")]


async def test_empty_script_yields_nothing() -> None:
    adapter = ScriptedAdapter([])
    assert await collect(adapter, req()) == []
    assert adapter.closed_streams == 1


async def test_records_requests() -> None:
    adapter = ScriptedAdapter(SCRIPT)
    request = req("x", prompt="p", seed=9, stop=("\n",))
    await collect(adapter, request)
    assert adapter.requests == [request]


async def test_delays_are_waited_not_yielded(sleeps: list[float]) -> None:
    adapter = ScriptedAdapter([Token("a"), Delay(0.25), Token("b"), Delay(1.5), SCRIPT[-1]])
    events = await collect(adapter, req())
    assert events == [Token("a"), Token("b"), SCRIPT[-1]]
    assert sleeps == [0.25, 1.5]


async def test_delay_lets_other_tasks_run() -> None:
    adapter = ScriptedAdapter([Token("a"), Delay(0), Token("b")])
    order: list[str] = []

    async def other() -> None:
        order.append("other")

    stream = open_stream(adapter, req())
    assert await stream.__anext__() == Token("a")
    task = asyncio.create_task(other())
    assert await stream.__anext__() == Token("b")  # passes through Delay(0)
    order.append("b")
    await task
    await stream.aclose()
    assert order == ["other", "b"]


# --- injected failures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [EngineFailure("boom"), EngineUnavailable("down"), RuntimeError("bug"), ValueError("x")],
    ids=lambda e: type(e).__name__,
)
async def test_raises_injected_exception_after_earlier_items(error: BaseException) -> None:
    adapter = ScriptedAdapter([Token("a"), Token("b"), error, Token("never"), SCRIPT[-1]])
    seen: list[AdapterEvent] = []
    with pytest.raises(type(error)) as info:
        await drain(adapter.stream(req()), seen)
    assert info.value is error
    assert seen == [Token("a"), Token("b")]
    assert adapter.closed_streams == 1


async def test_raises_at_once_when_first() -> None:
    error = EngineUnavailable("no engine")
    adapter = ScriptedAdapter([error, *SCRIPT])
    with pytest.raises(EngineUnavailable) as info:
        await collect(adapter, req())
    assert info.value is error
    assert info.value.retriable is True
    assert isinstance(info.value, AdapterError)


async def test_engine_failure_not_retriable_by_default() -> None:
    adapter = ScriptedAdapter([EngineFailure("bad reply")])
    with pytest.raises(EngineFailure) as info:
        await collect(adapter, req())
    assert info.value.retriable is False
    assert info.value.message == "bad reply"


async def test_retriable_flag_overridable() -> None:
    adapter = ScriptedAdapter([EngineFailure("flaky", retriable=True)])
    with pytest.raises(EngineFailure) as info:
        await collect(adapter, req())
    assert info.value.retriable is True


async def test_failure_is_repeated_on_every_stream() -> None:
    adapter = ScriptedAdapter([Token("a"), EngineFailure("again")])
    for _ in range(3):
        with pytest.raises(EngineFailure):
            await collect(adapter, req())
    assert adapter.closed_streams == 3
    assert len(adapter.requests) == 3


# --- cancel ------------------------------------------------------------------------------------


async def test_cancel_mid_stream_stops_it() -> None:
    adapter = ScriptedAdapter([Token("a"), Token("b"), Token("c"), SCRIPT[-1]])
    seen: list[AdapterEvent] = []
    async for event in adapter.stream(req("r1")):
        seen.append(event)
        await adapter.cancel("r1")
    assert seen == [Token("a")]
    assert adapter.cancelled == ["r1"]
    assert adapter.closed_streams == 1


async def test_cancel_skips_pending_failure_and_finish() -> None:
    adapter = ScriptedAdapter([Token("a"), Delay(0), EngineFailure("late"), SCRIPT[-1]])
    stream = open_stream(adapter, req("r1"))
    assert await stream.__anext__() == Token("a")
    await adapter.cancel("r1")
    assert [e async for e in stream] == []


async def test_cancel_from_another_task_during_delay() -> None:
    adapter = ScriptedAdapter([Token("a"), Delay(0), Delay(0), Token("b"), SCRIPT[-1]])
    stream = open_stream(adapter, req("r1"))
    assert await stream.__anext__() == Token("a")
    pending = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0)  # the stream is now inside the first Delay
    await adapter.cancel("r1")
    with pytest.raises(StopAsyncIteration):
        await pending
    assert adapter.closed_streams == 1


async def test_cancel_before_stream_yields_nothing() -> None:
    adapter = ScriptedAdapter(SCRIPT)
    await adapter.cancel("r1")
    assert await collect(adapter, req("r1")) == []
    assert adapter.requests[0].request_id == "r1"


async def test_cancel_only_stops_its_own_request() -> None:
    adapter = ScriptedAdapter(SCRIPT)
    a = open_stream(adapter, req("a"))
    b = open_stream(adapter, req("b"))
    assert await a.__anext__() == SCRIPT[0]
    assert await b.__anext__() == SCRIPT[0]
    await adapter.cancel("a")
    assert [e async for e in a] == []
    assert [e async for e in b] == SCRIPT[1:]
    assert adapter.cancelled == ["a"]


async def test_cancel_unknown_id_is_recorded_and_harmless() -> None:
    adapter = ScriptedAdapter(SCRIPT)
    await adapter.cancel("ghost")
    assert adapter.cancelled == ["ghost"]
    assert await collect(adapter, req("r1")) == SCRIPT


async def test_aclose_mid_stream_counts_as_closed() -> None:
    adapter = ScriptedAdapter(SCRIPT)
    stream = open_stream(adapter, req())
    await stream.__anext__()
    assert adapter.closed_streams == 0
    await stream.aclose()
    assert adapter.closed_streams == 1


# --- health and capabilities -------------------------------------------------------------------


@pytest.mark.parametrize("ready", [True, False])
async def test_health(ready: bool) -> None:
    adapter = ScriptedAdapter([], ready=ready)
    assert await adapter.health() == Health(live=True, ready=ready)
    adapter.ready = not ready
    assert (await adapter.health()).ready is (not ready)


async def test_capabilities() -> None:
    caps = await ScriptedAdapter([]).capabilities()
    assert isinstance(caps, Capabilities)
    assert caps.engine == "scripted"
    assert caps.model == "scripted"
    assert caps.model_hash == "sha256:" + "0" * 64
    assert caps.context_size == 1024
    assert caps.as_dict()["features"] == []


def test_kind() -> None:
    assert ScriptedAdapter.kind == "scripted"
    assert isinstance(ScriptedAdapter([]), WorkerAdapter)


async def test_adapter_aclose_is_harmless() -> None:
    adapter = ScriptedAdapter(SCRIPT)
    await adapter.aclose()
    assert await collect(adapter, req()) == SCRIPT
