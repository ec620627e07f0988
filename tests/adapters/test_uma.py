"""The UMA adapter against the reference runtime over a real Unix socket, and the runtime's
protocol rules spoken to over a raw socket."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
import socket
import struct
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from test_harness.uma_runtime import (
    TRANSITIONS,
    IllegalTransition,
    RuntimeConfig,
    SessionMachine,
    SessionState,
    UmaRuntime,
    serve_uma,
)
from worker_adapters import (
    AdapterError,
    AdapterEvent,
    EngineFailure,
    EngineUnavailable,
    Finish,
    GenerationRequest,
    Token,
)
from worker_adapters.llama import LlamaAdapter
from worker_adapters.sim import SimAdapter
from worker_adapters.uma import UmaAdapter
from worker_adapters.uma_frames import (
    E_LIMIT_PROMPT_TOO_LARGE,
    E_PROTO_BAD_REQUEST,
    E_PROTO_FRAME_TOO_LARGE,
    E_PROTO_INVALID_JSON,
    E_RUNTIME_BUSY,
    E_RUNTIME_DECODE,
    E_RUNTIME_RESOURCE_EXHAUSTED,
    ERROR_CODES,
    FrameDecoder,
    encode_frame,
)

SETTLE_S = 30  # a bound on waiting for the runtime to finish a session, never an assertion


@pytest.fixture
async def runtime() -> AsyncIterator[UmaRuntime]:
    async with serve_uma(engine=SimAdapter(tokens_per_s=0)) as rt:
        yield rt


@pytest.fixture
async def endless() -> AsyncIterator[UmaRuntime]:
    """A runtime whose sim never ends a stream by itself."""
    async with serve_uma(engine=SimAdapter(tokens_per_s=0, eos_probability=0.0)) as rt:
        yield rt


def make_adapter(rt: UmaRuntime, **kw: Any) -> UmaAdapter:
    return UmaAdapter(socket_path=rt.socket_path, model="sim-1", read_timeout_s=30.0, **kw)


def req(**kw: Any) -> GenerationRequest:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "prompt": "plan step tool",
        "messages": None,
        "seed": 7,
        "max_tokens": 40,
        "temperature": 0.7,
    }
    fields.update(kw)
    return GenerationRequest(**fields)


async def collect(adapter: Any, request: GenerationRequest) -> list[AdapterEvent]:
    return [event async for event in adapter.stream(request)]


async def settle(rt: UmaRuntime) -> None:
    await asyncio.wait_for(rt.settle(), SETTLE_S)


# --- generation --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
async def test_generation_equals_the_sim_for_the_same_seed(runtime: UmaRuntime, seed: int) -> None:
    request = req(seed=seed, max_tokens=60, top_p=0.9, top_k=5)
    over_uma = await collect(make_adapter(runtime), request)
    direct = await collect(SimAdapter(tokens_per_s=0), request)
    assert over_uma == direct
    assert isinstance(over_uma[-1], Finish)


async def test_both_stop_reasons_come_through(runtime: UmaRuntime) -> None:
    reasons = set()
    for seed in range(20):
        request = req(request_id=f"r{seed}", seed=seed, max_tokens=60)
        events = await collect(make_adapter(runtime), request)
        finish = events[-1]
        assert isinstance(finish, Finish)
        assert finish.tokens_out == len(events) - 1
        reasons.add(finish.stop_reason)
    assert reasons == {"eos", "length"}
    assert set(runtime.stats.outcomes.values()) == {"eos:stop", "eos:length"}


async def test_request_frame_carries_the_generation(runtime: UmaRuntime) -> None:
    messages = ({"role": "user", "content": "hi"},)
    request = req(prompt=None, messages=messages, seed=11, top_p=0.5, top_k=3)
    await collect(make_adapter(runtime), request)
    assert runtime.stats.requests == [
        {
            "id": "r1",
            "prompt": request.rendered_prompt(),
            "max_tokens": 40,
            "temperature": 0.7,
            "top_p": 0.5,
            "top_k": 3,
            "stream": True,
            "seed": 11,
        }
    ]


async def test_stop_string_cuts_the_stream_and_cancels_the_engine(endless: UmaRuntime) -> None:
    plain = await collect(make_adapter(endless), req(max_tokens=300))
    texts = [e.text for e in plain if isinstance(e, Token)]
    stop = "the "
    at = texts.index(stop)
    # the runtime waits a few tokens past the stop: the cancel reaches it mid-stream
    endless.faults.hold(after_tokens=at + 3)
    request = req(request_id="r2", max_tokens=300, stop=(stop,))
    events = await collect(make_adapter(endless), request)
    tokens = [e for e in events if isinstance(e, Token)]
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert [t.text for t in tokens] == texts[:at]
    assert finish.stop_reason == "stop" and finish.tokens_out == len(tokens) == at
    await settle(endless)
    assert endless.stats.cancels == ["r2"]
    assert endless.stats.outcomes["r2"] == "cancelled"
    assert endless.stats.tokens_sent["r2"] == at + 3


async def test_delayed_tokens_are_the_same_tokens(runtime: UmaRuntime) -> None:
    runtime.faults.delay_s = 0.001
    request = req(seed=2, max_tokens=10)
    assert await collect(make_adapter(runtime), request) == await collect(
        SimAdapter(tokens_per_s=0), request
    )


async def test_zero_max_tokens(runtime: UmaRuntime) -> None:
    events = await collect(make_adapter(runtime), req(max_tokens=0))
    assert events == [Finish(stop_reason="length", tokens_in=3, tokens_out=0)]


# --- errors ------------------------------------------------------------------------------------

EXPECTED = {
    E_PROTO_FRAME_TOO_LARGE: (EngineFailure, False),
    E_PROTO_INVALID_JSON: (EngineFailure, False),
    E_PROTO_BAD_REQUEST: (EngineFailure, False),
    E_LIMIT_PROMPT_TOO_LARGE: (EngineFailure, False),
    E_RUNTIME_DECODE: (EngineFailure, True),
    E_RUNTIME_BUSY: (AdapterError, True),
    E_RUNTIME_RESOURCE_EXHAUSTED: (AdapterError, True),
    # codes outside the table go by their family
    "E_PROTO_001": (EngineFailure, False),
    "E_LIMIT_001": (EngineFailure, False),
    "E_RUNTIME_KV_FULL": (EngineFailure, True),
    "E_SOMETHING_ELSE": (EngineFailure, False),
}


def test_every_code_of_the_protocol_is_mapped() -> None:
    assert set(ERROR_CODES) <= set(EXPECTED)


@pytest.mark.parametrize(("code", "expected"), sorted(EXPECTED.items()))
async def test_error_codes_map_to_adapter_errors(
    runtime: UmaRuntime, code: str, expected: tuple[type[AdapterError], bool]
) -> None:
    cls, retriable = expected
    runtime.faults.fail_next(1, code, message="from the test")
    with pytest.raises(AdapterError) as info:
        await collect(make_adapter(runtime), req())
    assert type(info.value) is cls
    assert info.value.retriable is retriable
    assert code in info.value.message and "from the test" in info.value.message
    assert runtime.stats.outcomes["r1"] == f"error:{code}"
    # the fault is spent: the next request runs
    assert isinstance((await collect(make_adapter(runtime), req(request_id="r2")))[-1], Finish)


async def test_error_after_some_tokens(runtime: UmaRuntime) -> None:
    runtime.faults.fail_next(1, E_RUNTIME_DECODE, after_tokens=3)
    seen: list[AdapterEvent] = []
    with pytest.raises(EngineFailure) as info:
        async for event in make_adapter(runtime).stream(req()):
            seen.append(event)
    assert len(seen) == 3 and all(isinstance(e, Token) for e in seen)
    assert info.value.retriable and E_RUNTIME_DECODE in info.value.message


async def test_oversize_request_frame_is_refused_by_the_runtime() -> None:
    async with serve_uma(config=RuntimeConfig(max_frame_bytes=512)) as rt:
        with pytest.raises(EngineFailure) as info:
            await collect(make_adapter(rt), req(prompt="x" * 100_000))
        assert E_PROTO_FRAME_TOO_LARGE in info.value.message and not info.value.retriable
        await settle(rt)
        assert rt.stats.requests == [] and rt.stats.errors == [E_PROTO_FRAME_TOO_LARGE]


async def test_oversize_request_is_not_sent_past_the_adapter_cap(runtime: UmaRuntime) -> None:
    adapter = make_adapter(runtime, max_frame_bytes=256)
    with pytest.raises(EngineFailure) as info:
        await collect(adapter, req(prompt="x" * 1000))
    assert E_PROTO_FRAME_TOO_LARGE in info.value.message and not info.value.retriable
    assert runtime.stats.errors == [] and runtime.stats.final_states == []


async def test_prompt_over_the_limit() -> None:
    async with serve_uma(config=RuntimeConfig(max_prompt_bytes=8)) as rt:
        with pytest.raises(EngineFailure) as info:
            await collect(make_adapter(rt), req(prompt="ééééé"))  # 10 bytes in UTF-8
        assert E_LIMIT_PROMPT_TOO_LARGE in info.value.message and not info.value.retriable
        events = await collect(make_adapter(rt), req(prompt="éééé", request_id="r2"))
        assert isinstance(events[-1], Finish)


async def test_invalid_sampling_is_a_bad_request(runtime: UmaRuntime) -> None:
    with pytest.raises(EngineFailure) as info:
        await collect(make_adapter(runtime), req(top_p=0.0))
    assert E_PROTO_BAD_REQUEST in info.value.message and not info.value.retriable


async def test_busy_when_every_slot_generates() -> None:
    async with serve_uma(
        engine=SimAdapter(tokens_per_s=0, eos_probability=0.0), config=RuntimeConfig(slots=1)
    ) as rt:
        release = rt.faults.hold(after_tokens=1)
        adapter = make_adapter(rt)
        first = cast(AsyncGenerator[AdapterEvent, None], adapter.stream(req(max_tokens=5)))
        assert isinstance(await first.__anext__(), Token)
        with pytest.raises(AdapterError) as info:
            await collect(adapter, req(request_id="r2"))
        assert type(info.value) is AdapterError and info.value.retriable
        assert E_RUNTIME_BUSY in info.value.message
        release.set()
        rest = [e async for e in first]
        assert len(rest) == 5 and rest[-1] == Finish("length", tokens_in=3, tokens_out=5)


async def test_engine_failure_is_a_decode_error(tmp_path: Path) -> None:
    broken = LlamaAdapter(model_path=tmp_path / "missing.gguf")
    async with serve_uma(engine=broken) as rt:
        adapter = make_adapter(rt)
        with pytest.raises(EngineFailure) as info:
            await collect(adapter, req())
        assert E_RUNTIME_DECODE in info.value.message and info.value.retriable
        assert "local model unavailable" in info.value.message
        health = await adapter.health()  # the runtime answers; its engine cannot generate
        assert health.live and not health.ready
    await broken.aclose()


async def test_missing_socket_is_unavailable(tmp_path: Path) -> None:
    adapter = UmaAdapter(socket_path=tmp_path / "nothing.sock", model="m")
    with pytest.raises(EngineUnavailable) as info:
        await collect(adapter, req())
    assert info.value.retriable
    health = await adapter.health()
    assert not health.live and not health.ready
    with pytest.raises(EngineUnavailable):
        await adapter.capabilities()


async def test_socket_nobody_listens_on_is_unavailable() -> None:
    with tempfile.TemporaryDirectory(prefix="uma-") as tmp:
        path = os.path.join(tmp, "stale.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
            bound.bind(path)  # bound, never listening: connections are refused
            with pytest.raises(EngineUnavailable) as info:
                await collect(UmaAdapter(socket_path=path, model="m"), req())
    assert "ConnectionRefusedError" in info.value.message


async def test_runtime_closing_mid_stream(runtime: UmaRuntime) -> None:
    runtime.faults.close_after(3)
    seen: list[AdapterEvent] = []
    with pytest.raises(EngineFailure) as info:
        async for event in make_adapter(runtime).stream(req()):
            seen.append(event)
    assert len(seen) == 3 and all(isinstance(e, Token) for e in seen)
    assert info.value.retriable
    assert runtime.stats.outcomes["r1"] == "cut"


async def test_runtime_stopping_mid_stream() -> None:
    async with serve_uma(engine=SimAdapter(tokens_per_s=0, eos_probability=0.0)) as rt:
        rt.faults.hold(after_tokens=2)
        stream = cast(
            AsyncGenerator[AdapterEvent, None], make_adapter(rt).stream(req(max_tokens=10))
        )
        assert isinstance(await stream.__anext__(), Token)
        assert isinstance(await stream.__anext__(), Token)
    with pytest.raises(EngineFailure) as info:  # the runtime is gone: its sessions closed
        await stream.__anext__()
    assert info.value.retriable and "closed" in info.value.message


# --- cancel ------------------------------------------------------------------------------------


async def test_cancel_mid_stream(endless: UmaRuntime) -> None:
    adapter = make_adapter(endless)
    seen: list[AdapterEvent] = []
    async for event in adapter.stream(req(max_tokens=1_000_000)):
        seen.append(event)
        if len(seen) == 3:
            await adapter.cancel("r1")
    assert len(seen) == 3 and all(isinstance(e, Token) for e in seen)
    await settle(endless)
    assert endless.stats.cancels == ["r1"]
    assert endless.stats.outcomes["r1"] == "cancelled"
    assert endless.stats.tokens_sent["r1"] < 1_000_000
    assert endless.stats.final_states == [SessionState.DONE]


async def test_cancel_from_another_task_while_the_engine_waits(endless: UmaRuntime) -> None:
    endless.faults.hold(after_tokens=2)  # never released: only the cancel ends the stream
    adapter = make_adapter(endless)
    seen: list[AdapterEvent] = []
    two = asyncio.Event()

    async def consume() -> None:
        async for event in adapter.stream(req(max_tokens=100)):
            seen.append(event)
            if len(seen) == 2:
                two.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(two.wait(), SETTLE_S)
    await adapter.cancel("r1")
    await asyncio.wait_for(task, SETTLE_S)
    assert len(seen) == 2 and not any(isinstance(e, Finish) for e in seen)
    await settle(endless)
    assert endless.stats.cancels == ["r1"] and endless.stats.tokens_sent["r1"] == 2


async def test_cancelling_the_task_mid_stream_always_reaches_the_engine(
    endless: UmaRuntime,
) -> None:
    """The dispatcher cancels a step by cancelling the task that reads its stream. Fifty
    times, at points spread over the first tokens of an endless stream: each time the task
    ends cancelled (a read that swallowed the cancellation would stream on, and this wait
    would end on its bound), and the runtime sees the request cancelled."""
    rng = random.Random(5)
    adapter = make_adapter(endless)
    for n in range(50):
        rid = f"c{n}"
        started = asyncio.Event()

        async def consume(rid: str = rid, started: asyncio.Event = started) -> None:
            async for _ in adapter.stream(req(request_id=rid, max_tokens=1_000_000)):
                started.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(started.wait(), SETTLE_S)
        for _ in range(rng.randrange(0, 40)):  # a few frames later, at a varying point
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, SETTLE_S)
    await settle(endless)
    assert sorted(endless.stats.outcomes.values()) == ["cancelled"] * 50


async def test_closing_the_iterator_cancels_the_request(endless: UmaRuntime) -> None:
    endless.faults.hold(after_tokens=2)
    stream = cast(
        AsyncGenerator[AdapterEvent, None], make_adapter(endless).stream(req(max_tokens=100))
    )
    await stream.__anext__()
    await stream.__anext__()
    await stream.aclose()
    await settle(endless)
    assert endless.stats.cancels == ["r1"]
    assert endless.stats.outcomes["r1"] == "cancelled"
    assert endless.stats.generating == 0


async def test_cancel_of_unknown_or_finished_requests_is_ignored(runtime: UmaRuntime) -> None:
    adapter = make_adapter(runtime)
    await adapter.cancel("nobody")
    first = await collect(adapter, req())
    await adapter.cancel("r1")
    assert await collect(adapter, req()) == first
    assert runtime.stats.cancels == []


# --- health and capabilities -------------------------------------------------------------------


async def test_health_asks_the_runtime(runtime: UmaRuntime) -> None:
    health = await make_adapter(runtime).health()
    assert health.live and health.ready
    await settle(runtime)
    assert runtime.stats.final_states == [SessionState.DONE]  # the metrics session closed


async def test_capabilities_from_the_metrics_snapshot(runtime: UmaRuntime) -> None:
    adapter = make_adapter(runtime, context_size=1024)
    caps = await adapter.capabilities()
    sim = await runtime.engine.capabilities()
    assert caps.engine == "uma" and caps.model == "sim-1"
    assert caps.model_hash == sim.model_hash
    assert caps.context_size == sim.context_size
    assert caps.engine_version == "uma-reference (sim 1.0)"
    assert {"seed", "stop", "cancel", "token_ids"} <= set(caps.features)
    assert caps.extra["socket_path"] == runtime.socket_path
    assert caps.extra["runtime_engine"] == "sim"
    assert await adapter.capabilities() is caps
    pinned = await make_adapter(runtime, model_hash="sha256:pinned").capabilities()
    assert pinned.model_hash == "sha256:pinned"


# --- the runtime's rules, over a raw socket ----------------------------------------------------


async def exchange(rt: UmaRuntime, *chunks: bytes) -> list[dict[str, Any]]:
    """Send ``chunks`` (each written and flushed on its own) and read every frame until the
    runtime closes the socket."""
    reader, writer = await asyncio.open_unix_connection(rt.socket_path)
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        decoder = FrameDecoder()
        frames: list[dict[str, Any]] = []
        while data := await asyncio.wait_for(reader.read(65536), SETTLE_S):
            frames.extend(decoder.frames(data))
        assert decoder.pending == 0
        return frames
    finally:
        writer.close()
        await writer.wait_closed()


def request_frame(**fields: Any) -> bytes:
    return encode_frame({"id": "q1", "prompt": "plan step", "seed": 3, "max_tokens": 6, **fields})


async def test_request_split_into_single_bytes_is_reassembled(endless: UmaRuntime) -> None:
    data = request_frame()
    frames = await exchange(endless, *(data[i : i + 1] for i in range(len(data))))
    assert [f["event"] for f in frames] == ["token"] * 6 + ["eos"]
    assert frames[-1] == {
        "id": "q1",
        "event": "eos",
        "reason": "length",
        "prompt_tokens": 2,
        "completion_tokens": 6,
    }


async def test_one_request_per_connection(endless: UmaRuntime) -> None:
    frames = await exchange(endless, request_frame())
    assert frames[-1]["event"] == "eos"  # ... and the socket closed after it
    assert endless.stats.final_states == [SessionState.DONE]


async def test_oversize_header_is_refused_before_its_payload(runtime: UmaRuntime) -> None:
    header = struct.pack("<I", runtime.config.max_frame_bytes + 1)
    frames = await exchange(runtime, header)
    assert len(frames) == 1
    assert frames[0]["event"] == "error" and frames[0]["code"] == E_PROTO_FRAME_TOO_LARGE
    assert runtime.stats.final_states == [SessionState.ERRORED]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"{not json", E_PROTO_INVALID_JSON),
        (b"", E_PROTO_INVALID_JSON),
        (b'{"id": "q1", "prompt": "\xff"}', E_PROTO_INVALID_JSON),
        (b'["q1", "hello"]', E_PROTO_BAD_REQUEST),
    ],
    ids=repr,
)
async def test_undecodable_frames(runtime: UmaRuntime, payload: bytes, code: str) -> None:
    frames = await exchange(runtime, struct.pack("<I", len(payload)) + payload)
    assert [(f["event"], f["code"]) for f in frames] == [("error", code)]
    assert runtime.stats.requests == []


@pytest.mark.parametrize(
    "fields",
    [
        {"id": None},
        {"id": ""},
        {"id": 5},
        {"prompt": None},
        {"prompt": 12},
        {"max_tokens": "9"},
        {"max_tokens": -1},
        {"max_tokens": 2.5},
        {"max_tokens": True},
        {"temperature": "hot"},
        {"temperature": -0.1},
        {"top_p": 1.5},
        {"top_k": -1},
        {"seed": "s"},
        {"stream": "yes"},
        {"slo": [150]},
        {"metadata": "m"},
    ],
    ids=repr,
)
async def test_bad_requests(runtime: UmaRuntime, fields: dict[str, Any]) -> None:
    body = {"id": "q1", "prompt": "plan", **fields}
    frames = await exchange(runtime, encode_frame({k: v for k, v in body.items() if v is not None}))
    assert len(frames) == 1 and frames[0]["event"] == "error"
    assert frames[0]["code"] == E_PROTO_BAD_REQUEST
    assert frames[0]["id"] == (body["id"] if isinstance(body.get("id"), str) else "")


async def test_optional_and_unknown_fields_are_accepted(endless: UmaRuntime) -> None:
    extra = {
        "stream": False,
        "slo": {"target_ttft_ms": 150, "target_tbt_ms": 80},
        "metadata": {"k": "v"},
        "future_field": [1, 2],
    }
    frames = await exchange(endless, request_frame(**extra))
    plain = await exchange(endless, request_frame())
    assert frames == plain and frames[-1]["event"] == "eos"


async def test_second_request_while_busy_is_refused(endless: UmaRuntime) -> None:
    endless.faults.hold(after_tokens=1)
    frames = await exchange(endless, request_frame(max_tokens=100) + request_frame(id="q2"))
    assert frames[-1] == {
        "id": "q2",
        "event": "error",
        "code": E_RUNTIME_BUSY,
        "message": "a request is in flight on this session",
    }
    assert all(f["event"] == "token" for f in frames[:-1])
    assert endless.stats.final_states == [SessionState.ERRORED]


async def test_cancel_frame_stops_the_request(endless: UmaRuntime) -> None:
    reader, writer = await asyncio.open_unix_connection(endless.socket_path)
    writer.write(request_frame(max_tokens=1_000_000))
    decoder = FrameDecoder()
    events: list[dict[str, Any]] = []
    while len(events) < 3:
        events.extend(decoder.frames(await asyncio.wait_for(reader.read(100), SETTLE_S)))
    writer.write(encode_frame({"event": "cancel", "id": "q1"}))
    while data := await asyncio.wait_for(reader.read(65536), SETTLE_S):
        events.extend(decoder.frames(data))  # what was sent before the cancel, then the close
    writer.close()
    await writer.wait_closed()
    assert {e["event"] for e in events} == {"token"}  # no eos after a cancel
    await settle(endless)
    assert endless.stats.cancels == ["q1"] and endless.stats.outcomes["q1"] == "cancelled"
    assert len(events) == endless.stats.tokens_sent["q1"] < 1_000_000


async def test_cancel_arriving_with_the_request_stops_it_before_any_token(
    endless: UmaRuntime,
) -> None:
    cancel = encode_frame({"event": "cancel", "id": "q1"})
    assert await exchange(endless, request_frame(max_tokens=100) + cancel) == []
    assert endless.stats.cancels == ["q1"]


async def test_cancel_of_another_id_and_before_a_request_is_ignored(endless: UmaRuntime) -> None:
    cancel = encode_frame({"event": "cancel", "id": "other"})
    frames = await exchange(endless, cancel + request_frame(), cancel)
    assert frames[-1]["event"] == "eos" and len(frames) == 7
    assert endless.stats.cancels == []


async def test_invalid_frame_while_generating_ends_the_session(endless: UmaRuntime) -> None:
    endless.faults.hold(after_tokens=1)
    frames = await exchange(endless, request_frame(max_tokens=100), b"\x03\x00\x00\x00abc")
    assert frames[-1]["event"] == "error" and frames[-1]["code"] == E_PROTO_INVALID_JSON
    assert frames[-1]["id"] == "q1"


async def test_metrics_frame_then_close(endless: UmaRuntime) -> None:
    await exchange(endless, request_frame())
    frames = await exchange(endless, encode_frame({"type": "metrics"}))
    assert len(frames) == 1
    snapshot = frames[0]
    assert snapshot["event"] == "metrics"
    assert snapshot["tokens_generated_total"] == 6
    assert snapshot["requests_total"] == 1
    assert snapshot["active_sessions"] == 1  # the metrics session itself
    assert snapshot["model"] == "sim-1" and snapshot["ready"] is True


async def test_idle_connection_is_closed() -> None:
    async with serve_uma(config=RuntimeConfig(idle_timeout_s=0.05)) as rt:
        assert await exchange(rt) == []
        assert await exchange(rt, request_frame()[:3]) == []  # a partial frame is no frame
        assert rt.stats.requests == []


@pytest.mark.parametrize("start", list(SessionState))
@pytest.mark.parametrize("to", list(SessionState))
def test_state_machine_refuses_illegal_moves(start: SessionState, to: SessionState) -> None:
    machine = SessionMachine()
    machine.state = start
    if to in TRANSITIONS[start]:
        machine.advance(to)
        assert machine.state is to
    else:
        with pytest.raises(IllegalTransition):
            machine.advance(to)
        assert machine.state is start


def test_ended_sessions_go_nowhere() -> None:
    assert TRANSITIONS[SessionState.DONE] == TRANSITIONS[SessionState.ERRORED] == frozenset()


# --- the local model ---------------------------------------------------------------------------

needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed"
)


@pytest.mark.slow
@needs_llama
async def test_local_model_over_uma_equals_the_model_direct() -> None:
    engine = LlamaAdapter(n_ctx=512)
    try:
        async with serve_uma(engine=engine) as rt:
            adapter = UmaAdapter(socket_path=rt.socket_path, model="gemma3-270m")
            request = req(prompt="The capital of France is", max_tokens=8, temperature=0.0)
            over_uma = await collect(adapter, request)
            caps = await adapter.capabilities()
        direct = await collect(engine, request)
        assert over_uma == direct
        assert caps.model_hash == (await engine.capabilities()).model_hash
    finally:
        await engine.aclose()


@pytest.mark.slow
@needs_llama
async def test_local_model_cancel_mid_stream() -> None:
    engine = LlamaAdapter(n_ctx=512)
    try:
        async with serve_uma(engine=engine) as rt:
            adapter = UmaAdapter(socket_path=rt.socket_path, model="gemma3-270m")
            seen: list[AdapterEvent] = []
            async for event in adapter.stream(req(prompt="Count: one two", max_tokens=200)):
                seen.append(event)
                if len(seen) == 2:
                    await adapter.cancel("r1")
            await settle(rt)
            assert len(seen) == 2 and rt.stats.cancels == ["r1"]
            assert rt.stats.tokens_sent["r1"] < 200
    finally:
        await engine.aclose()
