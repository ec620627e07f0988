"""The Kakeya adapter against the reference runtime over localhost gRPC."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import grpc  # type: ignore[import-untyped]
import pytest

from contracts.protos import load
from test_harness.kakeya_runtime import LlamaTokenEngine, RunningRuntime, serve_kakeya
from tests.adapters.conftest import ManualClock
from worker_adapters import AdapterError, EngineFailure, EngineUnavailable, GenerationRequest, Token
from worker_adapters.kakeya import KakeyaAdapter
from worker_adapters.session_handle import EngineSession
from worker_adapters.sessions import SessionDrift, SessionFinish, SessionLost
from worker_adapters.tokenizers import LlamaTokenizer, SimTokenizer, Tokenizer

PB = load().kakeya
SINK, WINDOW = 2, 40
PROMPT = "plan step tool call fact "


@pytest.fixture
async def runtime(clock: ManualClock) -> AsyncIterator[RunningRuntime]:
    async with serve_kakeya(sink=SINK, window=WINDOW, idle_ttl_s=60.0, clock=clock) as rt:
        yield rt


def make_adapter(
    rt: RunningRuntime, tokenizer: Tokenizer | None = None, **kw: Any
) -> KakeyaAdapter:
    tokenizer = tokenizer or SimTokenizer()
    return KakeyaAdapter(
        target=rt.address, tokenizer=tokenizer, model="sim-1", context_size=SINK + WINDOW, **kw
    )


@pytest.fixture
async def adapter(runtime: RunningRuntime) -> AsyncIterator[KakeyaAdapter]:
    adapter = make_adapter(runtime)
    yield adapter
    await adapter.aclose()


def req(prompt: str = PROMPT, **kw: Any) -> GenerationRequest:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "prompt": prompt,
        "messages": None,
        "seed": 7,
        "max_tokens": 6,
    }
    fields.update(kw)
    return GenerationRequest(**fields)


async def run(
    adapter: KakeyaAdapter, request: GenerationRequest
) -> tuple[list[Token], SessionFinish]:
    events = [e async for e in adapter.stream(request)]
    *tokens, finish = events
    assert isinstance(finish, SessionFinish), events[-1:]
    assert all(isinstance(t, Token) for t in tokens)
    return cast(list[Token], tokens), finish


def engine_tokens(rt: RunningRuntime, session: EngineSession) -> list[int]:
    assert session.session_id is not None
    return rt.store.sessions[session.session_id].tokens


async def test_one_shot_request_streams_and_closes_its_session(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    tokens, finish = await run(adapter, req())
    assert len(tokens) == 6 and all(t.token_id is not None for t in tokens)
    assert (finish.stop_reason, finish.engine_reason) == ("length", "STOP_REASON_MAX_TOKENS")
    assert finish.tokens_in == len(SimTokenizer().encode(PROMPT)) and finish.tokens_out == 6
    assert runtime.store.sessions == {}
    assert adapter.count_tokens(req()) == finish.tokens_in


async def test_a_session_carries_only_the_new_tokens_on_each_turn(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    first, _ = await run(adapter, req(session=session))
    sid = session.session_id
    assert sid is not None
    prompt2 = PROMPT + "".join(t.text for t in first) + "flow seed "
    second, finish = await run(adapter, req(prompt2, request_id="r2", session=session))
    held = runtime.store.sessions[sid]
    assert session.session_id == sid and session.rebuilds == 0
    # the prompt once, then two words: the generated tokens never crossed the wire again
    assert held.received == len(SimTokenizer().encode(PROMPT)) + 2
    assert held.tokens == session.history and session.history_length == len(held.tokens)
    assert finish.session_length == len(held.tokens)
    _, fresh = await run(adapter, req(prompt2, request_id="r3"))  # one-shot, same tokens
    assert [t.token_id for t in second] == session.history[-6:]
    assert fresh.tokens_in == finish.tokens_in


async def test_same_history_and_seed_give_identical_bytes_however_appended(
    runtime: RunningRuntime,
) -> None:
    history = list(range(3, 13))
    async with grpc.aio.insecure_channel(runtime.address) as channel:
        stub = load().kakeya_grpc.RuntimeServiceStub(channel)
        streams = []
        for chunks in ([history], [[t] for t in history], [history[:3], history[3:]]):
            sid = (await stub.CreateSession(PB.CreateSessionRequest())).session_id
            for chunk in chunks:
                await stub.AppendTokens(PB.AppendTokensRequest(session_id=sid, token_ids=chunk))
            call = stub.Generate(PB.GenerateRequest(session_id=sid, max_tokens=8, seed=11))
            streams.append([m.SerializeToString() async for m in call if not m.HasField("done")])
    assert len(streams[0]) == 8
    assert streams[0] == streams[1] == streams[2]


async def test_session_and_one_shot_give_the_same_tokens(adapter: KakeyaAdapter) -> None:
    session = adapter.open_session()
    await run(adapter, req("plan ", session=session, max_tokens=0))
    in_session, _ = await run(adapter, req(session=session, request_id="r2"))
    one_shot, _ = await run(adapter, req(request_id="r3"))
    assert [t.token_id for t in in_session] == [t.token_id for t in one_shot]


async def test_drift_is_detected_and_repaired_from_the_record(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    first, _ = await run(adapter, req(session=session))
    engine_tokens(runtime, session).append(5)  # the runtime now holds a token nobody sent
    old = session.session_id
    prompt2 = PROMPT + "".join(t.text for t in first) + "gate "
    second, _ = await run(adapter, req(prompt2, session=session, request_id="r2"))
    assert session.rebuilds == 1 and session.session_id != old
    assert old not in runtime.store.sessions
    assert engine_tokens(runtime, session) == session.history
    expected, _ = await run(adapter, req(prompt2, request_id="r3"))
    assert [t.token_id for t in second] == [t.token_id for t in expected]


async def test_drift_that_recreating_cannot_fix_raises(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    engine_tokens(runtime, session).append(5)
    runtime.faults.new_session_tokens = [2]  # every new session holds one token too many
    with pytest.raises(SessionDrift) as info:
        await run(adapter, req(PROMPT + "gate ", session=session, request_id="r2"))
    assert info.value.retriable and info.value.actual == info.value.expected + 1


async def test_a_lost_session_is_recreated_from_the_record(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    assert session.session_id is not None
    runtime.store.pop(session.session_id)
    second, finish = await run(adapter, req(PROMPT + "gate ", session=session, request_id="r2"))
    assert session.rebuilds == 1 and finish.stop_reason == "length"
    runtime.faults.fail_next(1, grpc.StatusCode.NOT_FOUND, method="Generate")
    prompt3 = PROMPT + "gate " + "".join(t.text for t in second)
    tokens, _ = await run(adapter, req(prompt3, session=session, request_id="r3"))
    assert session.rebuilds == 2 and len(tokens) == 6
    assert engine_tokens(runtime, session) == session.history


async def test_a_session_that_stays_lost_raises_session_lost(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    runtime.faults.fail_next(2, grpc.StatusCode.NOT_FOUND, method="Generate")
    with pytest.raises(SessionLost) as info:
        await run(adapter, req(session=session))
    assert info.value.retriable


@pytest.mark.parametrize(
    ("code", "error", "retriable"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, EngineFailure, False),
        (grpc.StatusCode.FAILED_PRECONDITION, AdapterError, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, AdapterError, True),
        (grpc.StatusCode.ABORTED, AdapterError, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, AdapterError, True),
        (grpc.StatusCode.UNAVAILABLE, EngineUnavailable, True),
        (grpc.StatusCode.INTERNAL, EngineFailure, False),
    ],
)
@pytest.mark.parametrize("method", ["CreateSession", "AppendTokens", "Generate"])
async def test_status_codes_map_to_adapter_errors(
    runtime: RunningRuntime,
    adapter: KakeyaAdapter,
    code: grpc.StatusCode,
    error: type[AdapterError],
    retriable: bool,
    method: str,
) -> None:
    runtime.faults.fail_next(1, code, method=method)
    with pytest.raises(error) as info:
        await run(adapter, req())
    assert info.value.retriable is retriable
    assert code.name in info.value.message


async def test_a_failure_mid_stream_marks_the_session_for_checking(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    runtime.faults.fail_next(1, grpc.StatusCode.UNAVAILABLE, method="Generate", after_tokens=2)
    with pytest.raises(EngineUnavailable):
        await run(adapter, req(session=session))
    assert session.verify and session.history == engine_tokens(runtime, session)
    prompt2 = "".join(SimTokenizer().piece(t).decode() for t in session.history) + "gate "
    await run(adapter, req(prompt2, session=session, request_id="r2"))
    assert not session.verify and session.rebuilds == 0


async def test_a_busy_session_is_a_retriable_error(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    release = runtime.faults.hold(after_tokens=1)
    first = adapter.stream(req(session=session))
    token = await anext(first)
    assert isinstance(token, Token)
    other = make_adapter(runtime)  # another replica of the control plane, same session
    prompt2 = PROMPT + token.text + "gate "  # extends the history: only "gate " is appended
    with pytest.raises(AdapterError) as info:
        await run(other, req(prompt2, session=session, request_id="r2"))
    assert info.value.retriable and "ABORTED" in info.value.message
    release.set()
    rest = [e async for e in first]
    assert isinstance(rest[-1], SessionFinish)
    await other.aclose()


async def test_cancel_stops_the_call_and_the_session_stays_usable(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    release = runtime.faults.hold(after_tokens=2)
    stream = adapter.stream(req(session=session, max_tokens=50))
    got = [await anext(stream), await anext(stream)]
    await adapter.cancel("r1")
    assert [e async for e in stream] == []  # no Finish after a cancel
    release.set()
    held = runtime.store.sessions[cast(str, session.session_id)]
    while held.busy:  # the runtime notices the cancelled call
        await asyncio.sleep(0.01)
    assert len(held.tokens) < len(SimTokenizer().encode(PROMPT)) + 50
    prompt2 = PROMPT + "".join(cast(Token, t).text for t in got)
    tokens, _ = await run(adapter, req(prompt2, session=session, request_id="r2"))
    assert len(tokens) == 6 and engine_tokens(runtime, session) == session.history


async def test_closing_the_iterator_cancels_the_call(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    release = runtime.faults.hold(after_tokens=1)
    stream = adapter.stream(req(max_tokens=50))
    assert isinstance(stream, AsyncGenerator)
    await anext(stream)
    await stream.aclose()
    release.set()
    while any(s.busy for s in runtime.store.sessions.values()):
        await asyncio.sleep(0.01)
    assert all(len(s.tokens) < 30 for s in runtime.store.sessions.values())


async def test_a_long_history_is_truncated_and_the_caller_is_told(adapter: KakeyaAdapter) -> None:
    session = adapter.open_session()
    long_prompt = "plan " * (SINK + WINDOW + 3)
    tokens, finish = await run(adapter, req(long_prompt, session=session))
    assert finish.truncated == 3 and session.dropped == 3
    assert (finish.stop_reason, finish.engine_reason) == ("length", "STOP_REASON_TRUNCATED")
    assert tokens == [] and finish.session_length == SINK + WINDOW


async def test_generation_stops_when_the_window_fills(adapter: KakeyaAdapter) -> None:
    tokens, finish = await run(adapter, req("plan " * (SINK + WINDOW - 4), max_tokens=10))
    assert len(tokens) == 4 and finish.truncated == 0
    assert finish.engine_reason == "STOP_REASON_TRUNCATED"


async def test_eos_token_ids_stop_the_stream(runtime: RunningRuntime) -> None:
    plain = make_adapter(runtime)
    ids = [t.token_id for t in (await run(plain, req()))[0]]
    stopper = make_adapter(runtime, eos_token_ids=(cast(int, ids[3]),))
    tokens, finish = await run(stopper, req())
    assert [t.token_id for t in tokens] == ids[: ids.index(ids[3])]
    assert (finish.stop_reason, finish.engine_reason) == ("eos", "STOP_REASON_EOS")
    await plain.aclose()
    await stopper.aclose()


async def test_stop_strings_end_the_stream(adapter: KakeyaAdapter) -> None:
    text = "".join(t.text for t in (await run(adapter, req()))[0])
    stop = text.split()[2]
    tokens, finish = await run(adapter, req(stop=(stop,), request_id="r2"))
    assert finish.stop_reason == "stop" and stop not in "".join(t.text for t in tokens)


async def test_fork_copies_a_prefix_of_the_history(
    runtime: RunningRuntime, adapter: KakeyaAdapter
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    child = await adapter.fork(session, at=4)
    assert child.session_id != session.session_id
    assert engine_tokens(runtime, child) == session.history[:4] == child.history
    with pytest.raises(EngineFailure):
        await adapter.fork(session, at=len(session.history) + 1)


async def test_idle_sessions_are_evicted_and_recreated(
    runtime: RunningRuntime, adapter: KakeyaAdapter, clock: ManualClock
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    # the runtime lets the session go once its reply is out: a busy one is never evicted
    while runtime.store.sessions[cast(str, session.session_id)].busy:
        await asyncio.sleep(0.01)
    clock.now += 61
    runtime.store.evict_idle()
    assert session.session_id in runtime.store.evicted
    await run(adapter, req(session=session, request_id="r2"))
    assert session.rebuilds == 1


async def test_runtime_validation_rules(runtime: RunningRuntime, clock: ManualClock) -> None:
    async with grpc.aio.insecure_channel(runtime.address) as channel:
        stub = load().kakeya_grpc.RuntimeServiceStub(channel)
        sid = (await stub.CreateSession(PB.CreateSessionRequest())).session_id
        await stub.AppendTokens(PB.AppendTokensRequest(session_id=sid, token_ids=[1, 2]))
        vocab = runtime.engine.vocab_size
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.AppendTokens(PB.AppendTokensRequest(session_id=sid, token_ids=[3, vocab]))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = await stub.GetSessionInfo(PB.GetSessionInfoRequest(session_id=sid))
        assert info.history_length == 2  # unchanged by the rejected append
        assert info.kv_live_bytes == 2 * runtime.engine.kv_bytes_per_token
        clock.now += 5
        info = await stub.GetSessionInfo(PB.GetSessionInfoRequest(session_id=sid))
        assert info.idle_seconds == 5
        closed = await stub.CloseSession(PB.CloseSessionRequest(session_id=sid))
        assert closed.final_history_length == 2
        for call in (
            stub.AppendTokens(PB.AppendTokensRequest(session_id=sid, token_ids=[1])),
            stub.GetSessionInfo(PB.GetSessionInfoRequest(session_id=sid)),
            stub.CloseSession(PB.CloseSessionRequest(session_id="never-issued")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as lost:
                await call
            assert lost.value.code() == grpc.StatusCode.NOT_FOUND


async def test_health_capabilities_and_token_counts(runtime: RunningRuntime) -> None:
    adapter = make_adapter(runtime)
    assert (await adapter.health()).ready
    caps = await adapter.capabilities()
    assert caps.engine == "kakeya" and caps.model_hash == SimTokenizer().fingerprint
    assert caps.context_size == SINK + WINDOW and "sessions" in caps.features
    runtime.faults.fail_next(1, grpc.StatusCode.INTERNAL, method="GetSessionInfo")
    sick = await adapter.health()
    assert sick.live and not sick.ready
    await adapter.aclose()


async def test_an_unreachable_runtime_is_unavailable() -> None:
    async with serve_kakeya() as rt:
        address = rt.address
    adapter = KakeyaAdapter(target=address, tokenizer=SimTokenizer(), model="m", context_size=8)
    health = await adapter.health()
    assert not health.live
    with pytest.raises(EngineUnavailable):
        await run(adapter, req())
    await adapter.aclose()


llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed"
)


@pytest.mark.slow
@llama
async def test_real_model_session_turns_match_a_one_shot_generation() -> None:
    tokenizer = LlamaTokenizer()
    async with serve_kakeya(engine=LlamaTokenEngine(context_size=256), window=200) as rt:
        adapter = make_adapter(rt, tokenizer)
        session = adapter.open_session()
        await run(adapter, req("The capital of France", session=session, max_tokens=0))
        turn, _ = await run(adapter, req("The capital of France is", session=session, max_tokens=3))
        one_shot, _ = await run(adapter, req("The capital of France is", max_tokens=3))
        assert [t.token_id for t in turn] == [t.token_id for t in one_shot]
        assert len(turn) == 3 and session.rebuilds <= 1
        await adapter.aclose()
