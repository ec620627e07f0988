"""The real local model: determinism, token ids, hashes, cancel, and the HTTP path."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.procs import ended_step, orchestratord
from worker_adapters import Finish, GenerationRequest, Token
from worker_adapters.llama import LlamaAdapter
from worker_adapters.transcript import TURN_STOPS, render_transcript

pytestmark = pytest.mark.slow


def req(seed: int, **kw: object) -> GenerationRequest:
    base: dict[str, object] = {
        "request_id": f"r{seed}",
        "prompt": "Once upon a time",
        "messages": None,
        "seed": seed,
        "max_tokens": 12,
        "temperature": 0.9,
        "top_k": 40,
    }
    base.update(kw)
    return GenerationRequest(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def adapter(gguf: Path) -> LlamaAdapter:
    return LlamaAdapter(model_path=gguf, n_ctx=1024)


async def run(adapter: LlamaAdapter, request: GenerationRequest) -> tuple[list[Token], Finish]:
    events = [ev async for ev in adapter.stream(request)]
    finish = events[-1]
    assert isinstance(finish, Finish)
    return [e for e in events if isinstance(e, Token)], finish


async def test_seeded_sampling_is_repeatable(adapter: LlamaAdapter) -> None:
    a, fa = await run(adapter, req(1))
    b, _ = await run(adapter, req(1))
    c, _ = await run(adapter, req(2))
    assert [(t.text, t.token_id) for t in a] == [(t.text, t.token_id) for t in b]
    assert [t.token_id for t in a] != [t.token_id for t in c]
    assert all(isinstance(t.token_id, int) for t in a)
    assert fa.tokens_out == len(a) and fa.tokens_in > 0


@pytest.mark.parametrize("seed", [2**32 - 1, 2**32, 2**63 - 1])
async def test_seeds_llama_cpp_reads_as_random_still_repeat(
    adapter: LlamaAdapter, seed: int
) -> None:
    a, _ = await run(adapter, req(seed, max_tokens=8))
    b, _ = await run(adapter, req(seed, max_tokens=8))
    assert [t.token_id for t in a] == [t.token_id for t in b]


async def test_capabilities_and_model_hash(adapter: LlamaAdapter, gguf: Path) -> None:
    caps = await adapter.capabilities()
    assert caps.model_hash == "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert caps.quantization == "Q4_K_M"
    assert caps.context_size == 1024
    assert {"logprobs", "json_schema", "seed"} <= set(caps.features)
    assert (await adapter.health()).ready


async def test_chat_stop_and_logprobs(adapter: LlamaAdapter) -> None:
    tokens, finish = await run(
        adapter,
        req(
            3,
            prompt=None,
            messages=({"role": "user", "content": "Say hello."},),
            logprobs=True,
            temperature=0.0,
        ),
    )
    assert finish.stop_reason in ("eos", "length")
    assert all(t.logprob is not None and t.logprob <= 0 for t in tokens)
    text = "".join(t.text for t in tokens)
    if len(text) > 3:
        stop = text[2:4]
        cut, f2 = await run(
            adapter,
            req(
                3,
                prompt=None,
                messages=({"role": "user", "content": "Say hello."},),
                temperature=0.0,
                stop=(stop,),
            ),
        )
        assert f2.stop_reason == "stop"
        assert "".join(t.text for t in cut) == text[: text.index(stop)]


TWO_TURNS = (
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
)


async def test_messages_get_a_reply_without_a_made_up_next_turn(adapter: LlamaAdapter) -> None:
    # the packaged file has no chat template: its messages are rendered as a transcript
    assert "chat_transcript" in (await adapter.capabilities()).features
    tokens, finish = await run(
        adapter, req(7, prompt=None, messages=TWO_TURNS, temperature=0.0, max_tokens=64)
    )
    reply = "".join(t.text for t in tokens)
    assert reply.strip() and "User:" not in reply and "Assistant:" not in reply
    assert finish.stop_reason == "eos"
    # the same transcript as a plain prompt: the model goes on to write the user's next turn,
    # and the reply above is exactly what it wrote before it
    transcript = render_transcript(TWO_TURNS).prompt
    plain, _ = await run(adapter, req(7, prompt=transcript, temperature=0.0, max_tokens=64))
    text = "".join(t.text for t in plain)
    assert "\nUser:" in text
    assert text[: min(text.find(s) for s in TURN_STOPS if s in text)] == reply
    assert finish.tokens_in == adapter.count_tokens(req(7, prompt=None, messages=TWO_TURNS))


async def test_equal_messages_give_equal_tokens(adapter: LlamaAdapter) -> None:
    a, _ = await run(adapter, req(8, prompt=None, messages=TWO_TURNS, max_tokens=16))
    b, _ = await run(adapter, req(8, prompt=None, messages=TWO_TURNS, max_tokens=16))
    assert [t.token_id for t in a] == [t.token_id for t in b] and a


async def test_cancel_stops_decoding(adapter: LlamaAdapter) -> None:
    request = req(4, max_tokens=400)
    seen = 0
    gen = adapter.stream(request)
    async for ev in gen:
        assert isinstance(ev, Token)
        seen += 1
        if seen == 3:
            await adapter.cancel(request.request_id)
            break
    await gen.aclose()  # type: ignore[attr-defined]
    assert not adapter.busy
    tokens, _ = await run(adapter, req(5, max_tokens=4))  # the slot is free again
    assert len(tokens) == 4


async def test_event_loop_stays_responsive(adapter: LlamaAdapter) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await run(adapter, req(6, max_tokens=24))
    task.cancel()
    assert ticks >= 5  # the loop ran while the model decoded on its thread


def _step(base: str, seed: int) -> dict[str, object]:
    with httpx.Client(base_url=base, timeout=120) as c:
        flow = c.post("/v1/flows", json={"ast": {"p": "det"}}).json()
        run = c.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": seed}).json()
        step = c.post(
            f"/v1/runs/{run['run_id']}/steps",
            json={
                "type": "llm_call",
                "client_token": "s",
                "input": {
                    "prompt": "The weather today",
                    "params": {"max_tokens": 12, "temperature": 0.8},
                },
            },
        ).json()
        return ended_step(c, step["step_id"])


def test_same_seed_same_tokens_across_restart(tmp_path: Path, gguf: Path) -> None:
    db = f"sqlite:///{tmp_path / 'o.db'}"
    with orchestratord(tmp_path, "--database-url", db) as base:  # llama is the default
        pools = httpx.get(f"{base}/v1/pools").json()
        assert pools[0]["engine"] == "llama"
        first = _step(base, 99)
    with orchestratord(tmp_path, "--database-url", db) as base:
        second = _step(base, 99)
        other = _step(base, 100)
    assert first["status"] == "succeeded"
    out1, out2 = first["output"], second["output"]
    assert isinstance(out1, dict) and isinstance(out2, dict)
    assert out1["token_ids"] == out2["token_ids"] and out1["text"] == out2["text"]
    assert len(out1["token_ids"]) > 0 and all(isinstance(t, int) for t in out1["token_ids"])
    assert isinstance(other["output"], dict) and other["output"]["token_ids"] != out1["token_ids"]
    prov = first["provenance"]
    assert isinstance(prov, dict)
    assert prov["model_hash"] == "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()


def test_the_model_opens_in_the_plain_cpu_layout(gguf: Path) -> None:
    """llama.cpp's extra buffer types are off (their AMX layout crashes the process at the
    first token on CPUs with AMX), for this model only: the library's defaults are back."""
    from worker_adapters.llama import open_model

    library: Any = importlib.import_module("llama_cpp.llama_cpp")
    defaults = library.llama_model_default_params
    llm = open_model(gguf, n_ctx=64, verbose=False)
    try:
        assert llm.model_params.use_extra_bufts is False
        assert library.llama_model_default_params is defaults
        assert library.llama_model_default_params().use_extra_bufts is True
        assert len(llm.tokenize(b"Once upon a time")) > 1
        llm.eval(llm.tokenize(b"Once upon a time"))  # the first product: where AMX crashed
    finally:
        llm.close()


@pytest.mark.parametrize(
    ("given", "decode", "prompt"),
    [
        ({}, max((os.cpu_count() or 2) // 2, 1), max((os.cpu_count() or 2) // 2, 1)),
        ({"n_threads": 2}, 2, 2),
        ({"n_threads": 1, "n_threads_batch": 2}, 1, 2),
    ],
)
def test_the_prompt_is_read_with_the_decode_threads_unless_told(
    gguf: Path, given: dict[str, int], decode: int, prompt: int
) -> None:
    """llama-cpp-python reads a prompt with every core by default, its threads spinning
    while they wait for a core the rest of the machine holds: the engine's default is
    llama.cpp's own, as many threads as decode."""
    from worker_adapters.llama import open_model

    llm = open_model(gguf, n_ctx=64, verbose=False, **given)
    try:
        assert (llm.context_params.n_threads, llm.context_params.n_threads_batch) == (
            decode,
            prompt,
        )
    finally:
        llm.close()


@pytest.mark.parametrize("field", ["n_threads", "n_threads_batch"])
def test_thread_counts_below_one_are_refused(field: str) -> None:
    from pydantic import ValidationError

    from worker_adapters.registry import variant

    with pytest.raises(ValidationError) as caught:
        variant("llama").parse_options({field: 0})
    assert [e["loc"] for e in caught.value.errors()] == [(field,)]
