"""The deterministic simulated engine (worker_adapters.sim)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, cast

import pytest

from worker_adapters import stops as stops_mod
from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)
from worker_adapters.sim import SIM_VERSION, VOCAB, SimAdapter, sim_token_count

DEFAULT_MODEL_HASH = "sha256:fe06ec47082b381fc6a8f021de66a8aa4180a4ede7ce5bc7ab78f4777b6d8c66"
NO_EOS_MODEL_HASH = "sha256:9c579de6f0b18f6b5da026a6dd066e5d3dd0c636e19f2fac4fd5367deda92597"
# seed 42, prompt "hello world", max_tokens 8, eos_probability 0.0.
PINNED_TOKEN_IDS = [49, 57, 59, 59, 54, 59, 62, 35]


def req(**overrides: Any) -> GenerationRequest:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "prompt": "hello world",
        "messages": None,
        "seed": 7,
        "max_tokens": 32,
    }
    fields.update(overrides)
    return GenerationRequest(**fields)


def fast(**kwargs: Any) -> SimAdapter:
    kwargs.setdefault("tokens_per_s", 0)
    return SimAdapter(**kwargs)


async def collect(adapter: WorkerAdapter, request: GenerationRequest) -> list[AdapterEvent]:
    return [event async for event in adapter.stream(request)]


def split(events: list[AdapterEvent]) -> tuple[list[Token], Finish]:
    """Tokens and the one Finish, which must come last and only once."""
    *tokens, finish = events
    assert isinstance(finish, Finish), events[-1:]
    assert all(isinstance(t, Token) for t in tokens)
    return cast(list[Token], tokens), finish


def text_of(tokens: list[Token]) -> str:
    return "".join(t.text for t in tokens)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every delay passed to asyncio.sleep while the test runs."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float, result: Any = None) -> Any:
        recorded.append(delay)
        return await real_sleep(delay, result)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    return recorded


# --- determinism -------------------------------------------------------------------------------


@pytest.mark.parametrize("eos_probability", [0.0, 0.02])
async def test_same_request_same_output_across_instances(eos_probability: float) -> None:
    request = req(max_tokens=64)
    a = await collect(fast(eos_probability=eos_probability), request)
    b = await collect(fast(eos_probability=eos_probability), request)
    assert a == b
    tokens, _ = split(a)
    assert tokens
    assert [t.token_id for t in tokens] == [t.token_id for t in split(b)[0]]
    assert [t.text for t in tokens] == [t.text for t in split(b)[0]]


async def test_same_request_same_output_on_one_instance() -> None:
    adapter = fast()
    assert await collect(adapter, req()) == await collect(adapter, req())


async def test_token_rate_is_not_an_input() -> None:
    request = req(max_tokens=5)
    assert await collect(fast(), request) == await collect(SimAdapter(tokens_per_s=1e6), request)


async def test_request_id_is_not_an_input() -> None:
    adapter = fast()
    assert await collect(adapter, req(request_id="a")) == await collect(
        adapter, req(request_id="b")
    )


async def test_pinned_output() -> None:
    request = req(prompt="hello world", seed=42, max_tokens=8)
    tokens, finish = split(await collect(fast(eos_probability=0.0), request))
    assert [t.token_id for t in tokens] == PINNED_TOKEN_IDS
    assert [t.text for t in tokens] == [VOCAB[i] for i in PINNED_TOKEN_IDS]
    assert finish == Finish(stop_reason="length", tokens_in=2, tokens_out=8)


async def test_different_seed_different_output() -> None:
    adapter = fast(eos_probability=0.0)
    outputs = {
        tuple(t.token_id for t in split(await collect(adapter, req(seed=seed)))[0])
        for seed in range(8)
    }
    assert len(outputs) == 8


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": "hello world!"},
        {"prompt": None, "messages": ({"role": "user", "content": "hello world"},)},
        {"temperature": 0.5},
        {"top_p": 0.9},
        {"top_k": 40},
        {"stop": ("zzzz",)},
        {"max_tokens": 33},
    ],
    ids=repr,
)
async def test_every_request_input_changes_the_output(change: dict[str, Any]) -> None:
    adapter = fast(eos_probability=0.0)
    base = split(await collect(adapter, req()))[0]
    other = split(await collect(adapter, req(**change)))[0]
    assert [t.token_id for t in base[:32]] != [t.token_id for t in other[:32]]


async def test_model_is_an_input() -> None:
    a = split(await collect(fast(eos_probability=0.0, model="m1"), req()))[0]
    b = split(await collect(fast(eos_probability=0.0, model="m2"), req()))[0]
    assert [t.token_id for t in a] != [t.token_id for t in b]


async def test_concurrent_streams_match_sequential_ones() -> None:
    adapter = fast(eos_probability=0.0)
    requests = [req(request_id=f"r{i}", seed=i, max_tokens=100) for i in range(5)]
    sequential = [await collect(adapter, r) for r in requests]
    concurrent = await asyncio.gather(*(collect(adapter, r) for r in requests))
    assert list(concurrent) == sequential
    assert adapter.active_requests == frozenset()


async def test_token_ids_index_the_vocabulary() -> None:
    tokens, _ = split(await collect(fast(eos_probability=0.0), req(max_tokens=200)))
    for token in tokens:
        assert token.token_id is not None
        assert 0 <= token.token_id < len(VOCAB)
        assert token.text == VOCAB[token.token_id]
        assert token.logprob is None


# --- lengths and finish ------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [0, 1, 5, 100, 300])
async def test_max_tokens_honored(max_tokens: int) -> None:
    tokens, finish = split(await collect(fast(eos_probability=0.0), req(max_tokens=max_tokens)))
    assert len(tokens) == max_tokens
    assert finish.stop_reason == "length"
    assert finish.tokens_out == max_tokens


async def test_eos_probability_one_stops_after_one_token() -> None:
    tokens, finish = split(await collect(fast(eos_probability=1.0), req(max_tokens=50)))
    assert len(tokens) == 1
    assert finish.stop_reason == "eos"
    assert finish.tokens_out == 1


@pytest.mark.parametrize("seed", range(12))
async def test_finish_tokens_out_counts_tokens(seed: int) -> None:
    tokens, finish = split(await collect(fast(eos_probability=0.05), req(seed=seed, max_tokens=60)))
    assert finish.tokens_out == len(tokens)
    assert finish.stop_reason in ("eos", "length")
    if finish.stop_reason == "length":
        assert len(tokens) == 60
    else:
        assert 1 <= len(tokens) < 60


async def test_default_eos_ends_some_streams_early() -> None:
    adapter = fast()
    reasons = set()
    for seed in range(10):
        tokens, finish = split(await collect(adapter, req(seed=seed, max_tokens=400)))
        assert finish.tokens_out == len(tokens)
        reasons.add(finish.stop_reason)
    assert "eos" in reasons


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        ({"prompt": "hello world"}, 2),
        ({"prompt": ""}, 0),
        ({"prompt": None}, 0),
        ({"prompt": "one two three four five"}, 5),
        (
            {
                "prompt": None,
                "messages": (
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"},
                ),
            },
            # "system: be brief\nuser: hi\nassistant:"
            6,
        ),
    ],
)
async def test_tokens_in_counts_the_rendered_prompt(
    request_fields: dict[str, Any], expected: int
) -> None:
    request = req(max_tokens=3, **request_fields)
    _, finish = split(await collect(fast(), request))
    assert finish.tokens_in == expected == sim_token_count(request.rendered_prompt())


@pytest.mark.parametrize(
    ("text", "count"),
    [("", 0), ("a", 1), ("a b", 2), ("a  b\n", 2), ("  x", 2), ("\n\n", 1), ("a,b c", 2)],
)
def test_sim_token_count(text: str, count: int) -> None:
    assert sim_token_count(text) == count


async def test_exactly_one_finish_and_last() -> None:
    events = await collect(fast(), req(max_tokens=50))
    finishes = [e for e in events if isinstance(e, Finish)]
    assert len(finishes) == 1
    assert events[-1] is finishes[0]


# --- stop strings ------------------------------------------------------------------------------


async def unstopped_text(
    monkeypatch: pytest.MonkeyPatch, adapter: SimAdapter, request: GenerationRequest
) -> str:
    """The text the engine would produce for ``request`` if it never matched a stop string.

    The stop strings stay in the request, so the generator is seeded exactly as in the real
    run; only the matching is switched off.
    """
    with monkeypatch.context() as m:
        m.setattr(stops_mod, "_first_stop", lambda *args: None)
        tokens, _ = split(await collect(adapter, request))
    return text_of(tokens)


@pytest.mark.parametrize("stop", ["the", "amma", "lattice.", "o", "!"])
@pytest.mark.parametrize("seed", range(6))
async def test_stop_inside_one_token(monkeypatch: pytest.MonkeyPatch, stop: str, seed: int) -> None:
    adapter = fast(eos_probability=0.0)
    request = req(seed=seed, max_tokens=300, stop=(stop,))
    full = await unstopped_text(monkeypatch, adapter, request)
    tokens, finish = split(await collect(adapter, request))
    text = text_of(tokens)
    assert stop not in text
    assert finish.tokens_out == len(tokens)
    if stop in full:
        assert finish.stop_reason == "stop"
        assert text == full[: full.index(stop)]
    else:
        assert finish.stop_reason == "length"
        assert text == full


async def test_stop_cuts_a_token() -> None:
    # "amma" occurs only inside "gamma ": the token is cut to "g" and the stream stops.
    tokens, finish = split(
        await collect(fast(eos_probability=0.0), req(max_tokens=300, stop=("amma",)))
    )
    assert finish.stop_reason == "stop"
    assert tokens[-1].text == "g"
    assert tokens[-1].token_id == VOCAB.index("gamma ")
    assert finish.tokens_out == len(tokens)
    assert "amma" not in text_of(tokens)


@pytest.mark.parametrize("stop", ["the ", "! "])
async def test_stop_at_a_token_start_emits_nothing_of_it(stop: str) -> None:
    adapter = fast(eos_probability=0.0)
    for seed in range(20):
        tokens, finish = split(await collect(adapter, req(seed=seed, max_tokens=300, stop=(stop,))))
        if finish.stop_reason == "stop":
            break
    else:
        pytest.fail(f"no seed met the stop {stop!r}")
    assert all(t.text == VOCAB[t.token_id or 0] for t in tokens)
    assert stop not in text_of(tokens)
    assert finish.tokens_out == len(tokens)


async def test_earliest_of_several_stops_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = fast(eos_probability=0.0)
    request = req(seed=3, max_tokens=300, stop=("zzz", "the", "o"))
    full = await unstopped_text(monkeypatch, adapter, request)
    tokens, finish = split(await collect(adapter, request))
    first = min(i for i in (full.find("the"), full.find("o")) if i != -1)
    assert finish.stop_reason == "stop"
    assert text_of(tokens) == full[:first]


async def test_empty_and_unmet_stops_are_ignored() -> None:
    tokens, finish = split(
        await collect(fast(eos_probability=0.0), req(max_tokens=40, stop=("", "qqqq")))
    )
    assert finish.stop_reason == "length"
    assert len(tokens) == 40


@pytest.mark.parametrize("stop", ["e t", "the of"])
async def test_stop_spanning_tokens_is_not_emitted(
    monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    # Every vocabulary piece is one word and a space, so these stops span two tokens.
    adapter = fast(eos_probability=0.0)
    met = 0
    for seed in range(30):
        request = req(prompt="hi", seed=seed, max_tokens=500, stop=(stop,))
        full = await unstopped_text(monkeypatch, adapter, request)
        if stop not in full:
            continue
        met += 1
        tokens, finish = split(await collect(adapter, request))
        assert finish.stop_reason == "stop"
        assert finish.tokens_out == len(tokens)
        assert text_of(tokens) == full[: full.index(stop)], f"seed {seed}"
    assert met


# --- cancel ------------------------------------------------------------------------------------


async def test_cancel_mid_stream_fast() -> None:
    adapter = fast(eos_probability=0.0)
    request = req(max_tokens=10_000)
    stream = cast(AsyncGenerator[AdapterEvent, None], adapter.stream(request))
    seen: list[AdapterEvent] = []
    async for event in stream:
        seen.append(event)
        assert request.request_id in adapter.active_requests
        if len(seen) == 3:
            await adapter.cancel(request.request_id)
    assert len(seen) == 3
    assert all(isinstance(e, Token) for e in seen)
    assert adapter.active_requests == frozenset()


async def test_cancel_from_another_task_while_paced() -> None:
    adapter = SimAdapter(tokens_per_s=2000, eos_probability=0.0)
    request = req(max_tokens=1_000_000)
    seen: list[AdapterEvent] = []
    two_seen = asyncio.Event()

    async def consume() -> None:
        async for event in adapter.stream(request):
            seen.append(event)
            if len(seen) == 2:
                two_seen.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(two_seen.wait(), timeout=60)
    await adapter.cancel(request.request_id)
    await asyncio.wait_for(task, timeout=60)
    assert len(seen) >= 2
    assert len(seen) < 1_000_000
    assert not any(isinstance(e, Finish) for e in seen)
    assert adapter.active_requests == frozenset()


async def test_cancel_only_stops_its_own_request() -> None:
    adapter = fast(eos_probability=0.0)
    a = cast(AsyncGenerator[AdapterEvent, None], adapter.stream(req(request_id="a", max_tokens=20)))
    b = cast(AsyncGenerator[AdapterEvent, None], adapter.stream(req(request_id="b", max_tokens=20)))
    first_a = await a.__anext__()
    first_b = await b.__anext__()
    assert adapter.active_requests == {"a", "b"}
    await adapter.cancel("a")
    rest_a = [e async for e in a]
    rest_b = [e async for e in b]
    assert isinstance(first_a, Token)
    assert rest_a == []
    tokens, finish = split([first_b, *rest_b])
    assert len(tokens) == 20
    assert finish.stop_reason == "length"


async def test_cancel_unknown_or_finished_request_is_ignored() -> None:
    adapter = fast(eos_probability=0.0)
    await adapter.cancel("nobody")
    request = req(max_tokens=5)
    before = await collect(adapter, request)
    # Cancelled after it ended: the id is not remembered, so a new stream runs in full.
    await adapter.cancel(request.request_id)
    assert await collect(adapter, request) == before
    assert len(split(before)[0]) == 5


async def test_cancel_before_stream_starts_is_ignored() -> None:
    adapter = fast(eos_probability=0.0)
    await adapter.cancel("r1")
    tokens, finish = split(await collect(adapter, req(request_id="r1", max_tokens=4)))
    assert len(tokens) == 4
    assert finish.stop_reason == "length"


async def test_same_id_runs_again_after_cancel() -> None:
    adapter = fast(eos_probability=0.0)
    request = req(max_tokens=10)
    stream = cast(AsyncGenerator[AdapterEvent, None], adapter.stream(request))
    await stream.__anext__()
    await adapter.cancel(request.request_id)
    assert [e async for e in stream] == []
    tokens, finish = split(await collect(adapter, request))
    assert len(tokens) == 10
    assert finish.tokens_out == 10


async def test_aclose_releases_the_request() -> None:
    adapter = fast(eos_probability=0.0)
    stream = cast(AsyncGenerator[AdapterEvent, None], adapter.stream(req(max_tokens=100)))
    await stream.__anext__()
    assert adapter.active_requests == {"r1"}
    await stream.aclose()
    assert adapter.active_requests == frozenset()


# --- pacing ------------------------------------------------------------------------------------


async def test_fast_mode_never_sleeps(sleeps: list[float]) -> None:
    tokens, finish = split(await collect(fast(eos_probability=0.0), req(max_tokens=500)))
    assert len(tokens) == 500
    assert finish.stop_reason == "length"
    assert sleeps  # it does yield to the loop ...
    assert all(d == 0 for d in sleeps)  # ... but never waits


async def test_fast_mode_lets_other_tasks_run() -> None:
    adapter = fast(eos_probability=0.0)
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start_ticks = ticks
    tokens, _ = split(await collect(adapter, req(max_tokens=2000)))
    ticks_during = ticks - start_ticks
    done = True
    await task
    assert len(tokens) == 2000
    assert ticks_during >= 10


async def test_paced_mode_sleeps_between_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock that moves only while the adapter sleeps (a loaded machine cannot put it
    behind schedule), every token waits one token interval."""
    loop = asyncio.get_running_loop()
    now = [loop.time()]
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def virtual_sleep(delay: float, result: Any = None) -> Any:
        delays.append(delay)
        now[0] += max(delay, 0.0)
        return await real_sleep(0, result)

    monkeypatch.setattr(asyncio, "sleep", virtual_sleep)
    monkeypatch.setattr(loop, "time", lambda: now[0])
    adapter = SimAdapter(tokens_per_s=1000, eos_probability=0.0)
    tokens, _ = split(await collect(adapter, req(max_tokens=5)))
    assert len(tokens) == 5
    assert delays == pytest.approx([1 / 1000] * 5)


def test_negative_rate_refused() -> None:
    with pytest.raises(ValueError, match="tokens_per_s"):
        SimAdapter(tokens_per_s=-1)


# --- health, capabilities, model hash ----------------------------------------------------------


async def test_health() -> None:
    health = await fast().health()
    assert health == Health(live=True, ready=True)


async def test_capabilities() -> None:
    adapter = SimAdapter(tokens_per_s=25.0, model="sim-x", context_size=2048)
    caps = await adapter.capabilities()
    assert isinstance(caps, Capabilities)
    assert caps.engine == "sim"
    assert caps.engine_version == SIM_VERSION
    assert caps.model == "sim-x"
    assert caps.model_hash == adapter.model_hash
    assert caps.context_size == 2048
    assert caps.quantization is None
    assert set(caps.features) >= {"seed", "stop", "token_ids"}
    assert caps.as_dict() == {
        "engine": "sim",
        "engine_version": SIM_VERSION,
        "model": "sim-x",
        "models": ["sim-x"],
        "model_hash": adapter.model_hash,
        "context_size": 2048,
        "quantization": None,
        "features": list(caps.features),
        "tokens_per_s": 25.0,
    }


def test_kind() -> None:
    assert SimAdapter.kind == "sim"
    assert isinstance(fast(), WorkerAdapter)


def test_model_hash_shape_and_pinned_values() -> None:
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", SimAdapter().model_hash)
    assert SimAdapter().model_hash == DEFAULT_MODEL_HASH
    assert SimAdapter(eos_probability=0.0).model_hash == NO_EOS_MODEL_HASH


def test_model_hash_stable_across_instances() -> None:
    assert SimAdapter().model_hash == SimAdapter().model_hash
    assert SimAdapter(tokens_per_s=0).model_hash == SimAdapter(tokens_per_s=99).model_hash
    assert SimAdapter(context_size=10).model_hash == SimAdapter(context_size=20).model_hash


@pytest.mark.parametrize("change", [{"model": "sim-2"}, {"eos_probability": 0.5}], ids=repr)
def test_model_hash_tracks_what_changes_output(change: dict[str, Any]) -> None:
    assert SimAdapter(**change).model_hash != SimAdapter().model_hash


def test_vocabulary_pieces() -> None:
    assert len(VOCAB) == len(set(VOCAB))
    assert all(piece.endswith(" ") and piece.strip() for piece in VOCAB)


async def test_aclose_hook_is_harmless() -> None:
    adapter = fast()
    closer: Callable[[], Awaitable[None]] = adapter.aclose
    await closer()
    assert (await adapter.health()).ready


async def test_int_and_float_eos_probability_are_one_engine() -> None:
    as_int = SimAdapter(tokens_per_s=0, eos_probability=0)
    as_float = SimAdapter(tokens_per_s=0, eos_probability=0.0)
    assert as_int.model_hash == as_float.model_hash
    assert await collect(as_int, req()) == await collect(as_float, req())


async def test_int_and_float_sampling_params_are_one_request() -> None:
    adapter = fast(eos_probability=0.0)
    as_float = await collect(adapter, req(temperature=1.0, top_p=1.0))
    as_int = await collect(adapter, req(temperature=1, top_p=1))
    assert as_int == as_float
