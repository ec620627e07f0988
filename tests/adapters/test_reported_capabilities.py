"""What engines report of themselves in their capabilities: the models they serve, their
context size, and the model's size where the engine tells it.

The OpenAI adapter reads ``GET /v1/models`` (the fake engine answers as vLLM does, with
``max_model_len``; as llama.cpp's server does, with ``meta``; or badly); the in-process llama
adapter reads the opened model; every other adapter reports the one model it serves. The
slow tests use the packaged Gemma 3 270M: in process, and behind llama-cpp-python's own
server in a subprocess."""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from test_harness.fake_openai import FakeState, Faults, create_fake_openai
from test_harness.kakeya_runtime import serve_kakeya
from test_harness.salience_runtime import serve_salience
from test_harness.servers import serve_app
from test_harness.uma_runtime import serve_uma
from tests.procs import free_port, process
from worker_adapters import Capabilities, EngineUnavailable, WorkerAdapter
from worker_adapters.kakeya import KakeyaAdapter
from worker_adapters.llama import LlamaAdapter
from worker_adapters.openai import OpenAIAdapter
from worker_adapters.registry import EngineDefaults, ReplicaConfig, variant
from worker_adapters.salience import SalienceAdapter
from worker_adapters.scripted import ScriptedAdapter
from worker_adapters.sim import SimAdapter
from worker_adapters.tokenizers import SimTokenizer
from worker_adapters.uma import UmaAdapter


@pytest.fixture
async def engine() -> AsyncIterator[tuple[FakeState, str]]:
    """The fake OpenAI engine serving three models (vLLM's model list) and its base URL."""
    state = FakeState(also_serves=("zeta-7b", "alpha-1b"), max_model_len=8192)
    async with serve_app(create_fake_openai(state)) as url:
        yield state, f"{url}/v1"


async def caps_of(base_url: str, **kw: Any) -> Capabilities:
    adapter = OpenAIAdapter(base_url=base_url, **kw)
    try:
        return await adapter.capabilities()
    finally:
        await adapter.aclose()


# --- the OpenAI adapter: GET /v1/models -----------------------------------------------------


async def test_openai_reports_every_model_id_and_vllm_s_max_model_len(
    engine: tuple[FakeState, str],
) -> None:
    state, url = engine
    caps = await caps_of(url, model="fake-model", api_key="sk-secret")
    assert caps.models == ("alpha-1b", "fake-model", "zeta-7b")
    assert caps.context_size == 8192
    assert caps.model == "fake-model"
    shown = caps.as_dict()
    assert shown["models"] == ["alpha-1b", "fake-model", "zeta-7b"]
    assert shown["context_size"] == 8192
    assert state.models_auth == ["Bearer sk-secret"]  # the model list is asked with the key
    assert "sk-secret" not in str(shown)


async def test_openai_the_model_hash_is_the_same_at_every_listing(
    engine: tuple[FakeState, str],
) -> None:
    """vLLM and llama.cpp's servers date each listing (``created``): the hash of the model
    entry leaves that out, or each restart of the service would look like another model to
    strict_replay."""
    state, url = engine
    first = await caps_of(url, model="fake-model")
    second = await caps_of(url, model="fake-model")
    assert state.listings == 2
    assert first.model_hash == second.model_hash
    other = await caps_of(url, model="zeta-7b")
    assert other.model_hash != first.model_hash


async def test_openai_without_a_configured_model_names_the_first_reported(
    engine: tuple[FakeState, str],
) -> None:
    _, url = engine
    caps = await caps_of(url)
    assert caps.model == "fake-model"  # the first in the engine's list, not the first sorted
    assert caps.models == ("alpha-1b", "fake-model", "zeta-7b")


async def test_openai_a_configured_context_size_wins_over_the_reported_one(
    engine: tuple[FakeState, str],
) -> None:
    _, url = engine
    assert (await caps_of(url, context_size=1024)).context_size == 1024
    built = variant("openai").adapter_for(
        ReplicaConfig(replica_id="r0", url=url, address=url, model="fake-model", slots=1),
        {"context_size": 3000},
        EngineDefaults(),
    )
    try:
        assert (await built.capabilities()).context_size == 3000
    finally:
        await built.aclose()


@pytest.mark.parametrize("status", [500, 404, 401])
async def test_openai_a_model_list_that_fails_still_gives_capabilities(
    engine: tuple[FakeState, str], status: int, caplog: pytest.LogCaptureFixture
) -> None:
    state, url = engine
    state.faults = Faults(models_status=status)
    adapter = OpenAIAdapter(base_url=url, model="fake-model", model_hash="sha256:pinned")
    try:
        with caplog.at_level(logging.WARNING, logger="worker_adapters.openai"):
            caps = await adapter.capabilities()
        assert caps.model == "fake-model" and caps.models == ("fake-model",)
        assert caps.context_size == 0  # unknown
        assert caps.model_hash == "sha256:pinned"
        assert caps.as_dict()["models"] == ["fake-model"]
        assert f"HTTP {status}" in caplog.text
        # not kept: the next refresh asks again, and reads the engine's list once it answers
        state.faults = Faults()
        again = await adapter.capabilities()
        assert again.models == ("alpha-1b", "fake-model", "zeta-7b")
        assert again.context_size == 8192
        assert await adapter.capabilities() is again
    finally:
        await adapter.aclose()


@pytest.mark.parametrize(
    "body",
    [
        b"<html>not json</html>",
        b"[1, 2, 3]",
        b'{"object": "list", "data": "fake-model"}',
        b'{"object": "list"}',
        b"null",
    ],
)
async def test_openai_a_model_list_that_is_garbage_still_gives_capabilities(
    engine: tuple[FakeState, str], body: bytes
) -> None:
    state, url = engine
    state.faults = Faults(models_body=body)
    caps = await caps_of(url, model="fake-model")
    assert caps.engine == "openai"
    assert caps.model == "fake-model" and caps.models == ("fake-model",)
    assert caps.context_size == 0
    assert "json_schema" in caps.features and caps.model_hash.startswith("sha256:")


async def test_openai_entries_without_an_id_or_with_odd_fields_are_left_out(
    engine: tuple[FakeState, str],
) -> None:
    state, url = engine
    listed = {
        "data": [
            "a string",
            {"object": "model"},
            {"id": 7},
            {"id": "real", "max_model_len": "lots", "meta": "none"},
        ]
    }
    state.faults = Faults(models_body=orjson.dumps(listed))
    caps = await caps_of(url)
    assert caps.models == ("real",) and caps.model == "real"
    assert caps.context_size == 0


async def test_openai_an_engine_that_lists_no_models_still_gives_capabilities(
    engine: tuple[FakeState, str],
) -> None:
    state, url = engine
    state.faults = Faults(models_body=b'{"object": "list", "data": []}')
    caps = await caps_of(url, model="configured")
    assert caps.model == "configured" and caps.models == ("configured",)
    assert caps.context_size == 0


async def test_openai_llama_cpp_server_meta_gives_the_context_and_the_model_s_size(
    engine: tuple[FakeState, str],
) -> None:
    """llama.cpp's own server (``llama-server``) lists each model with ``meta``: ``n_ctx``
    (the context it opened, newer servers) before ``n_ctx_train`` (the model's own)."""
    state, url = engine
    meta = {"n_ctx": 4096, "n_ctx_train": 32768, "n_params": 268098176, "size": 241410624}
    entry = {"id": "gemma.gguf", "object": "model", "owned_by": "llamacpp", "meta": meta}
    state.faults = Faults(models_body=orjson.dumps({"object": "list", "data": [entry]}))
    caps = await caps_of(url)
    assert caps.models == ("gemma.gguf",) and caps.context_size == 4096
    shown = caps.as_dict()
    assert shown["n_params"] == 268098176
    assert shown["model_size_bytes"] == 241410624
    assert shown["n_ctx_train"] == 32768
    del meta["n_ctx"]  # an older server: only the trained context
    state.faults = Faults(models_body=orjson.dumps({"object": "list", "data": [entry]}))
    assert (await caps_of(url)).context_size == 32768


async def test_openai_an_engine_that_cannot_be_reached_is_unavailable() -> None:
    """Nothing is known of an engine that does not answer: its pool shows what is declared
    (``tests/pools/test_capabilities.py``), and the health refresh goes on."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EngineUnavailable):
        await caps_of(url, model="m")


# --- every adapter reports the models it serves ---------------------------------------------


def test_models_default_to_the_model_and_are_a_list_in_the_dict() -> None:
    one = Capabilities(engine="e", engine_version="1", model="m", model_hash="h", context_size=8)
    assert one.models == ("m",) and one.as_dict()["models"] == ["m"]
    many = Capabilities(
        engine="e", engine_version="1", model="m", model_hash="h", context_size=8, models=("a", "m")
    )
    assert many.as_dict()["models"] == ["a", "m"]
    nameless = Capabilities(
        engine="e", engine_version="1", model="", model_hash="h", context_size=0
    )
    assert nameless.as_dict()["models"] == []


async def reported(adapter: WorkerAdapter) -> dict[str, Any]:
    try:
        return (await adapter.capabilities()).as_dict()
    finally:
        await adapter.aclose()


async def test_in_process_adapters_report_their_model() -> None:
    assert (await reported(SimAdapter(model="sim-x")))["models"] == ["sim-x"]
    assert (await reported(ScriptedAdapter([])))["models"] == ["scripted"]


async def test_session_engines_report_their_model() -> None:
    async with serve_kakeya() as rt:
        kakeya = KakeyaAdapter(
            target=rt.address, tokenizer=SimTokenizer(), model="sim-1", context_size=64
        )
        assert (await reported(kakeya))["models"] == ["sim-1"]
    async with serve_salience() as rt:
        salience = SalienceAdapter(target=rt.address, tokenizer=SimTokenizer(), model="sim-1")
        assert (await reported(salience))["models"] == ["sim-1"]
    async with serve_uma() as rt:
        uma = UmaAdapter(socket_path=rt.socket_path, model="sim-1")
        assert (await reported(uma))["models"] == ["sim-1"]


# --- the real model -------------------------------------------------------------------------


@pytest.mark.slow
async def test_llama_reports_the_opened_context_its_model_and_its_size(gguf: Path) -> None:
    adapter = LlamaAdapter(model_path=gguf, n_ctx=1024, model="gemma-local")
    try:
        caps = await adapter.capabilities()
        assert caps.context_size == 1024 == adapter._llm.n_ctx()
        assert caps.model == "gemma-local" and caps.models == ("gemma-local",)
        shown = caps.as_dict()
        assert shown["models"] == ["gemma-local"]
        assert shown["model_size_bytes"] == gguf.stat().st_size
        assert shown["n_params"] == adapter._llm._model.n_params() > 0
        assert shown["n_ctx_train"] == adapter._llm._model.n_ctx_train() > 1024
    finally:
        await adapter.aclose()


def _server_importable() -> bool:
    try:
        return importlib.util.find_spec("llama_cpp.server.app") is not None
    except ImportError:  # llama_cpp itself, or the server's own dependencies, missing
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _server_importable(), reason="llama_cpp.server is not installed")
async def test_openai_against_llama_cpp_python_s_own_server(tmp_path: Path, gguf: Path) -> None:
    """llama-cpp-python's server (``python -m llama_cpp.server``, its model opened in the plain
    CPU layout by ``test_harness/llama_server.py``) lists its model by alias (default: the
    model's path) and tells no context size: the configured one is what is reported."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "test_harness.llama_server", "--model", str(gguf)]
    cmd += ["--port", str(port), "--n_ctx", "1024", "--api_key", "sk-local"]
    # /v1/models asks for the key too: the server is ready once its (open) docs page answers
    with process(cmd, ready_url=f"{base}/docs", cwd=tmp_path, timeout_s=120):
        told = await caps_of(f"{base}/v1", api_key="sk-local")
        assert told.models == (str(gguf),) and told.model == str(gguf)
        assert told.context_size == 0  # this server reports none
        configured = await caps_of(
            f"{base}/v1", api_key="sk-local", model=str(gguf), context_size=1024
        )
        assert configured.models == (str(gguf),) and configured.context_size == 1024
        refused = await caps_of(f"{base}/v1", api_key="wrong", model="m")
        assert refused.models == ("m",) and refused.context_size == 0  # HTTP 401
