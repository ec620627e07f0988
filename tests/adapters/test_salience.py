"""The Salience adapter against the reference server over localhost gRPC."""

from __future__ import annotations

import asyncio
import importlib.util
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import grpc  # type: ignore[import-untyped]
import pytest

from contracts.protos import load
from test_harness.kakeya_runtime import LlamaTokenEngine, RunningRuntime, Sampling, SimTokenEngine
from test_harness.salience_runtime import serve_salience
from tests.adapters.conftest import ManualClock
from worker_adapters import AdapterError, EngineFailure, EngineUnavailable, GenerationRequest, Token
from worker_adapters.base import RankedToken
from worker_adapters.salience import SalienceAdapter
from worker_adapters.session_handle import EngineSession
from worker_adapters.sessions import SessionDrift, SessionFinish, SessionLost
from worker_adapters.sim import VOCAB
from worker_adapters.tokenizers import LlamaTokenizer, SimTokenizer, Tokenizer

PB = load().salience
PROMPT = "plan step tool call fact "
TOKENIZER = SimTokenizer()


@pytest.fixture
async def runtime(clock: ManualClock) -> AsyncIterator[RunningRuntime]:
    async with serve_salience(idle_ttl_s=60.0, clock=clock) as rt:
        yield rt


def make_adapter(
    rt: RunningRuntime, tokenizer: Tokenizer = TOKENIZER, **kw: Any
) -> SalienceAdapter:
    kw.setdefault("model", "sim-1")
    return SalienceAdapter(target=rt.address, tokenizer=tokenizer, **kw)


@pytest.fixture
async def adapter(runtime: RunningRuntime) -> AsyncIterator[SalienceAdapter]:
    adapter = make_adapter(runtime, top_logprobs=3)
    yield adapter
    await adapter.aclose()


def req(prompt: str = PROMPT, **kw: Any) -> GenerationRequest:
    fields: dict[str, Any] = {"request_id": "r1", "prompt": prompt, "messages": None}
    fields.update({"seed": 0, "max_tokens": 6, **kw})
    return GenerationRequest(**fields)


async def run(
    adapter: SalienceAdapter, request: GenerationRequest
) -> tuple[list[Token], SessionFinish]:
    events = [e async for e in adapter.stream(request)]
    *tokens, finish = events
    assert isinstance(finish, SessionFinish), events[-1:]
    return cast(list[Token], tokens), finish


def held(rt: RunningRuntime, session: EngineSession) -> list[int]:
    return rt.store.sessions[cast(str, session.session_id)].tokens


def text(tokens: list[Token]) -> str:
    return "".join(t.text for t in tokens)


async def test_one_shot_request(runtime: RunningRuntime, adapter: SalienceAdapter) -> None:
    tokens, finish = await run(adapter, req())
    assert len(tokens) == 6 and finish.stop_reason == "length"
    assert finish.engine_reason == "FINISH_REASON_LENGTH"
    assert finish.tokens_in == len(TOKENIZER.encode(PROMPT)) == adapter.count_tokens(req())
    assert runtime.store.sessions == {}


async def test_turns_send_only_new_tokens(
    runtime: RunningRuntime, adapter: SalienceAdapter
) -> None:
    session = adapter.open_session()
    first, _ = await run(adapter, req(session=session))
    prompt2 = PROMPT + text(first) + "flow seed "
    second, _ = await run(adapter, req(prompt2, session=session, request_id="r2"))
    sid = cast(str, session.session_id)
    assert runtime.store.sessions[sid].received == len(TOKENIZER.encode(PROMPT)) + 2
    assert held(runtime, session) == session.history and session.rebuilds == 0
    fresh, _ = await run(adapter, req(prompt2, request_id="r3"))
    assert [t.token_id for t in second] == [t.token_id for t in fresh]


async def test_a_rewritten_prompt_rewinds_instead_of_resending(
    runtime: RunningRuntime, adapter: SalienceAdapter
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    sid = session.session_id
    await run(adapter, req(PROMPT + "gate ", session=session, request_id="r2"))
    assert session.session_id == sid and held(runtime, session) == session.history
    assert runtime.store.sessions[cast(str, sid)].received == len(TOKENIZER.encode(PROMPT)) + 1


async def test_offset_drift_is_repaired_from_the_server_record(
    runtime: RunningRuntime, adapter: SalienceAdapter
) -> None:
    session = adapter.open_session()
    first, _ = await run(adapter, req(session=session))
    held(runtime, session).append(5)  # the server now holds a token the record lacks
    prompt2 = PROMPT + text(first) + "gate "
    second, _ = await run(adapter, req(prompt2, session=session, request_id="r2"))
    assert (
        held(runtime, session)
        == session.history
        == TOKENIZER.encode(prompt2) + [t.token_id for t in second]
    )
    fresh, _ = await run(adapter, req(prompt2, request_id="r3"))
    assert [t.token_id for t in second] == [t.token_id for t in fresh]


async def test_drift_that_persists_raises(
    runtime: RunningRuntime, adapter: SalienceAdapter
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    runtime.faults.fail_next(2, grpc.StatusCode.FAILED_PRECONDITION, method="Generate")
    with pytest.raises(SessionDrift) as info:
        await run(adapter, req(session=session, request_id="r2"))
    assert info.value.retriable


async def test_lost_sessions_are_reopened_once(
    runtime: RunningRuntime, adapter: SalienceAdapter
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    runtime.store.pop(cast(str, session.session_id))
    await run(adapter, req(session=session, request_id="r2"))
    assert session.rebuilds == 1 and held(runtime, session) == session.history
    runtime.faults.fail_next(2, grpc.StatusCode.NOT_FOUND, method="Generate")
    with pytest.raises(SessionLost):
        await run(adapter, req(session=session, request_id="r3"))


@pytest.mark.parametrize(
    ("code", "error", "retriable"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, EngineFailure, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, AdapterError, True),
        (grpc.StatusCode.ABORTED, AdapterError, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, AdapterError, True),
        (grpc.StatusCode.UNAVAILABLE, EngineUnavailable, True),
        (grpc.StatusCode.INTERNAL, EngineFailure, False),
    ],
)
@pytest.mark.parametrize("method", ["OpenSession", "Generate"])
async def test_status_codes_map_to_adapter_errors(
    runtime: RunningRuntime,
    adapter: SalienceAdapter,
    code: grpc.StatusCode,
    error: type[AdapterError],
    retriable: bool,
    method: str,
) -> None:
    runtime.faults.fail_next(1, code, method=method)
    with pytest.raises(error) as info:
        await run(adapter, req())
    assert info.value.retriable is retriable and code.name in info.value.message


async def test_real_rejections_map_too(runtime: RunningRuntime) -> None:
    wrong_model = make_adapter(runtime, model="other-model")
    with pytest.raises(EngineFailure):
        await run(wrong_model, req())
    adapter = make_adapter(runtime)
    huge = "plan " * (runtime.engine.context_size + 1)
    with pytest.raises(AdapterError) as info:
        await run(adapter, req(huge))
    assert info.value.retriable and "RESOURCE_EXHAUSTED" in info.value.message
    session = adapter.open_session()
    release = runtime.faults.hold(after_tokens=1)
    first = adapter.stream(req(session=session))
    token = await anext(first)
    other = make_adapter(runtime)
    with pytest.raises(AdapterError) as busy:
        await run(other, req(PROMPT + cast(Token, token).text, session=session, request_id="r2"))
    assert busy.value.retriable and "ABORTED" in busy.value.message
    release.set()
    assert isinstance([e async for e in first][-1], SessionFinish)
    for a in (wrong_model, adapter, other):
        await a.aclose()


async def test_logprobs_and_top_alternatives(adapter: SalienceAdapter) -> None:
    tokens, _ = await run(adapter, req(logprobs=True))
    uniform = -math.log(len(VOCAB))  # the sim draws uniformly over its words
    for token in tokens:
        assert isinstance(token, RankedToken)
        assert token.logprob == pytest.approx(uniform)
        assert len(token.alternatives) == 3
        assert [a.logprob for a in token.alternatives] == pytest.approx([uniform] * 3)
        assert [a.text for a in token.alternatives] == list(VOCAB[:3])
    plain, _ = await run(adapter, req(request_id="r2"))
    assert all(type(t) is Token and t.logprob is None and not t.alternatives for t in plain)


async def test_cancel_and_resume(runtime: RunningRuntime, adapter: SalienceAdapter) -> None:
    session = adapter.open_session()
    release = runtime.faults.hold(after_tokens=2)
    stream = adapter.stream(req(session=session, max_tokens=50))
    got = [await anext(stream), await anext(stream)]
    await adapter.cancel("r1")
    assert [e async for e in stream] == []
    release.set()
    while runtime.store.sessions[cast(str, session.session_id)].busy:
        await asyncio.sleep(0.01)
    prompt2 = PROMPT + text(cast(list[Token], got)) + "gate "
    tokens, _ = await run(adapter, req(prompt2, session=session, request_id="r2"))
    assert len(tokens) == 6 and held(runtime, session) == session.history


async def test_fork(runtime: RunningRuntime, adapter: SalienceAdapter) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    child = await adapter.fork(session, at=3)
    assert held(runtime, child) == session.history[:3] == child.history
    await run(adapter, req("plan step tool flow ", session=child, request_id="r2"))
    assert held(runtime, child)[:3] == session.history[:3] and len(held(runtime, session)) == 11
    with pytest.raises(EngineFailure):
        await adapter.fork(session, at=100)


async def test_idle_eviction(
    runtime: RunningRuntime, adapter: SalienceAdapter, clock: ManualClock
) -> None:
    session = adapter.open_session()
    await run(adapter, req(session=session))
    # the runtime lets the session go once its reply is out: a busy one is never evicted
    while runtime.store.sessions[cast(str, session.session_id)].busy:
        await asyncio.sleep(0.01)
    clock.now += 61
    runtime.store.evict_idle()
    assert runtime.store.evicted == [session.session_id]
    await run(adapter, req(session=session, request_id="r2"))
    assert session.rebuilds == 1


async def test_server_validation_rules(runtime: RunningRuntime) -> None:
    async with grpc.aio.insecure_channel(runtime.address) as channel:
        stub = load().salience_grpc.SalienceStub(channel)
        sid = (await stub.OpenSession(PB.OpenSessionRequest(model="sim-1"))).session_id

        async def generate(**kw: Any) -> list[Any]:
            return [e async for e in stub.Generate(PB.GenerateRequest(session_id=sid, **kw))]

        await generate(append_tokens=[1, 2, 3])
        cases: list[tuple[dict[str, Any], Any]] = [
            ({"offset": 2, "append_tokens": [4]}, grpc.StatusCode.FAILED_PRECONDITION),
            ({"offset": 5, "truncating": True}, grpc.StatusCode.FAILED_PRECONDITION),
            (
                {"offset": 3, "append_tokens": [runtime.engine.vocab_size]},
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            (
                {"offset": 3, "logprobs_ranges": [PB.PositionRange(start=2, end=2)]},
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
        ]
        for kw, code in cases:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await generate(**kw)
            assert info.value.code() == code
            dump = await stub.DumpSession(PB.DumpSessionRequest(session_id=sid))
            assert list(dump.tokens) == [1, 2, 3]  # a rejected call changes nothing
        events = await generate(
            offset=1,
            truncating=True,
            append_tokens=[7],
            max_tokens=0,
            logprobs_ranges=[PB.PositionRange(start=0, end=2)],
            logprob_top_k=2,
        )
        prefill = [e.token for e in events[:-1]]
        assert [(t.position, t.id, t.is_prefill) for t in prefill] == [(0, 1, True), (1, 7, True)]
        assert not prefill[0].has_sampled_logprob and prefill[1].has_sampled_logprob
        assert events[-1].done.prompt_tokens == 2 and events[-1].done.completion_tokens == 0
        await stub.CloseSession(PB.CloseSessionRequest(session_id=sid))
        await stub.CloseSession(PB.CloseSessionRequest(session_id=sid))  # idempotent
        with pytest.raises(grpc.aio.AioRpcError) as lost:
            await stub.DumpSession(PB.DumpSessionRequest(session_id=sid))
        assert lost.value.code() == grpc.StatusCode.NOT_FOUND


async def test_health_and_capabilities(runtime: RunningRuntime, adapter: SalienceAdapter) -> None:
    assert (await adapter.health()).ready
    caps = await adapter.capabilities()
    assert caps.context_size == runtime.engine.context_size and caps.engine == "salience"
    assert runtime.store.sessions == {}
    async with serve_salience() as rt:
        address = rt.address
    gone = SalienceAdapter(target=address, tokenizer=TOKENIZER, model="sim-1")
    assert not (await gone.health()).live
    with pytest.raises(EngineUnavailable):
        await run(gone, req())
    await gone.aclose()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed"
)
async def test_real_model_logprobs() -> None:
    async with serve_salience(engine=LlamaTokenEngine(context_size=128), model="gemma") as rt:
        adapter = make_adapter(rt, LlamaTokenizer(), model="gemma", top_logprobs=2)
        tokens, _ = await run(adapter, req("The capital of France is", max_tokens=3, logprobs=True))
        assert 1 <= len(tokens) <= 3
        for token in tokens:
            assert isinstance(token, RankedToken) and token.logprob is not None
            assert token.logprob <= 0 and len(token.alternatives) == 2
            assert token.alternatives[0].logprob >= token.alternatives[1].logprob
        await adapter.aclose()


@dataclass
class RecordingEngine:
    """The sim engine, keeping the sampling each generation asked for."""

    inner: SimTokenEngine = field(default_factory=SimTokenEngine)
    asked: list[Sampling] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, tokens: list[int], sampling: Sampling) -> Any:
        self.asked.append(sampling)
        return self.inner.run(tokens, sampling)


@pytest.mark.parametrize(
    ("temperature", "top_k", "sent"),
    [(0.0, 0, (1.0, 1)), (0.0, 40, (1.0, 1)), (0.7, 0, (0.7, 0)), (1.3, 5, (1.3, 5))],
)
async def test_greedy_is_sent_as_top_k_one(
    temperature: float, top_k: int, sent: tuple[float, int]
) -> None:
    """The proto reads a temperature of 0 as 1.0: a greedy step sent as such sampled at T=1."""
    engine = RecordingEngine()
    async with serve_salience(engine=cast(Any, engine)) as rt:
        adapter = make_adapter(rt)
        await run(adapter, req(temperature=temperature, top_k=top_k))
        await adapter.aclose()
    [asked] = engine.asked
    assert (round(asked.temperature, 3), asked.top_k) == sent


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed"
)
async def test_real_model_greedy_is_the_argmax() -> None:
    engine = LlamaTokenEngine(context_size=128)
    prompt = "Once upon a time, in a land far away,"
    async with serve_salience(engine=engine, model="gemma") as rt:
        adapter = make_adapter(rt, LlamaTokenizer(), model="gemma")
        tokens, _ = await run(adapter, req(prompt, max_tokens=8, temperature=0.0))
        await adapter.aclose()
    ids = LlamaTokenizer().encode(prompt)
    async with engine.run(ids, Sampling(seed=0, temperature=0.0)) as direct:
        argmax = [t async for t in direct.decode(8)]
    assert [t.token_id for t in tokens] == argmax[: len(tokens)] and tokens
