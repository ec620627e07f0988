"""The OpenAI-compatible adapter against the fake server, with every injected fault."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from test_harness.fake_openai import FakeState, Faults, create_fake_openai, fake_tokens
from test_harness.servers import serve_app
from worker_adapters import EngineFailure, EngineUnavailable, Finish, GenerationRequest, Token
from worker_adapters.openai import OpenAIAdapter


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeState, OpenAIAdapter]]:
    state = FakeState()
    async with serve_app(create_fake_openai(state)) as url:
        adapter = OpenAIAdapter(
            base_url=f"{url}/v1", model="fake-model", api_key="sk-secret", read_timeout_s=2.0
        )
        yield state, adapter
        await adapter.aclose()


def req(**kw: object) -> GenerationRequest:
    base: dict[str, object] = {
        "request_id": "r1",
        "prompt": "hello",
        "messages": None,
        "seed": 7,
        "max_tokens": 12,
        "temperature": 0.0,
    }
    base.update(kw)
    return GenerationRequest(**base)  # type: ignore[arg-type]


async def collect(adapter: OpenAIAdapter, request: GenerationRequest) -> list[object]:
    return [ev async for ev in adapter.stream(request)]


async def test_completion_stream_and_usage(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    state, adapter = fake
    events = await collect(adapter, req(stop=("zz",), top_k=5, logprobs=True))
    tokens = [e for e in events if isinstance(e, Token)]
    finish = events[-1]
    assert isinstance(finish, Finish)
    body = state.requests[0]
    assert [t.text for t in tokens] == fake_tokens(body)
    assert finish.tokens_out == 12 and finish.tokens_in > 0
    assert finish.stop_reason == "length"
    assert body["seed"] == 7 and body["temperature"] == 0.0 and body["top_k"] == 5
    assert body["stop"] == ["zz"] and body["stream"] is True and body["logprobs"] == 1
    assert state.auth_headers[0] == "Bearer sk-secret"


async def test_chat_stream(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    state, adapter = fake
    events = await collect(adapter, req(prompt=None, messages=({"role": "user", "content": "hi"},)))
    assert "messages" in state.requests[0]
    assert [e.text for e in events if isinstance(e, Token)] == fake_tokens(state.requests[0])


async def test_refused_connection_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    adapter = OpenAIAdapter(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-secret")
    with pytest.raises(EngineUnavailable) as info:
        await collect(adapter, req())
    assert info.value.retriable
    assert "sk-secret" not in str(info.value)
    health = await adapter.health()
    assert not health.ready and not health.live
    await adapter.aclose()


@pytest.mark.parametrize(
    ("status", "retriable"), [(500, True), (503, True), (429, True), (400, False), (401, False)]
)
async def test_http_errors(
    fake: tuple[FakeState, OpenAIAdapter], status: int, retriable: bool
) -> None:
    state, adapter = fake
    state.faults = Faults(status=status)
    with pytest.raises(EngineFailure) as info:
        await collect(adapter, req())
    assert info.value.retriable is retriable
    assert str(status) in info.value.message


async def test_stream_cut_midway(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    state, adapter = fake
    state.faults = Faults(cut_after=3)
    seen: list[object] = []
    with pytest.raises(EngineFailure) as info:
        async for ev in adapter.stream(req()):
            seen.append(ev)
    assert len(seen) == 3
    assert info.value.retriable


async def test_malformed_chunk(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    state, adapter = fake
    state.faults = Faults(malformed_at=2)
    with pytest.raises(EngineFailure) as info:
        await collect(adapter, req())
    assert "malformed" in info.value.message


async def test_slow_first_byte_times_out(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    state, adapter = fake
    state.faults = Faults(first_byte_delay_s=5.0)
    with pytest.raises(EngineFailure) as info:
        await collect(adapter, req())
    assert "timed out" in info.value.message and info.value.retriable


async def test_slow_first_byte_within_timeout(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    state, adapter = fake
    state.faults = Faults(first_byte_delay_s=0.3)
    events = await collect(adapter, req())
    assert isinstance(events[-1], Finish)


async def test_cancel_closes_upstream(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    state, adapter = fake
    state.faults = Faults(token_delay_s=0.05)
    gen = adapter.stream(req(max_tokens=200))
    assert isinstance(gen, AsyncGenerator)
    first = await gen.__anext__()
    assert isinstance(first, Token)
    assert state.active == 1
    await adapter.cancel("r1")
    with pytest.raises(EngineFailure):
        await gen.__anext__()
    await gen.aclose()
    for _ in range(100):
        if state.active == 0:
            break
        await asyncio.sleep(0.02)
    assert state.active == 0
    assert state.disconnects == 1 and state.completed == 0


async def test_health_and_capabilities(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    _, adapter = fake
    health = await adapter.health()
    assert health.ready
    caps = await adapter.capabilities()
    assert caps.model == "fake-model"
    assert caps.context_size == 2048
    assert caps.model_hash.startswith("sha256:")
    assert "sk-secret" not in repr(adapter) and "sk-secret" not in str(caps.as_dict())


class _ImportWatch:
    """A meta path finder that only records the modules the import system went looking for."""

    def __init__(self) -> None:
        self.looked_up: list[str] = []

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        self.looked_up.append(name)
        return None


async def test_a_request_searches_for_no_module(fake: tuple[FakeState, OpenAIAdapter]) -> None:
    """httpcore sets up its request locks with an ``import sniffio``; were it missing, every
    request would search the file system for it (a failed import is not cached)."""
    import sys

    _, adapter = fake
    await collect(adapter, req())  # warm: the first request may import what it needs once
    watch = _ImportWatch()
    sys.meta_path.insert(0, watch)
    try:
        for i in range(3):
            await collect(adapter, req(request_id=f"r{i}"))
    finally:
        sys.meta_path.remove(watch)
    assert watch.looked_up == []


async def test_generations_one_after_another_share_one_connection(
    fake: tuple[FakeState, OpenAIAdapter],
) -> None:
    """The body is read to its end after ``[DONE]``, so the connection goes back to the pool
    (left unread, it was closed: a TCP handshake on every next request's time to first
    token)."""
    state, adapter = fake
    for i in range(5):
        events = await collect(adapter, req(request_id=f"r{i}", max_tokens=3))
        assert isinstance(events[-1], Finish)
    assert len(state.client_ports) == 5
    assert len(set(state.client_ports)) == 1, state.client_ports


async def test_a_body_left_open_after_done_ends_the_generation_at_the_read_timeout(
    fake: tuple[FakeState, OpenAIAdapter],
) -> None:
    """Reading past ``[DONE]`` must not turn a finished generation into a failure."""
    state, adapter = fake
    state.faults.hold_after_done_s = 5.0  # longer than the adapter's 2 s read timeout
    events = await collect(adapter, req(max_tokens=3))
    assert [type(e) for e in events] == [Token, Token, Token, Finish]
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.tokens_out == 3


async def test_errors_name_the_engine_without_its_credentials() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    adapter = OpenAIAdapter(base_url=f"http://u:pw-secret@127.0.0.1:{port}/v1?key=qs-secret")
    with pytest.raises(EngineUnavailable) as info:
        await collect(adapter, req())
    assert f"127.0.0.1:{port}/v1/completions" in info.value.message
    with pytest.raises(EngineUnavailable) as caps:
        await adapter.capabilities()
    for message in (info.value.message, caps.value.message):
        assert "pw-secret" not in message and "qs-secret" not in message
    await adapter.aclose()
