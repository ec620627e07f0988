"""Pools of the session-bound engines (Kakeya, Salience gRPC; UMA framed JSON) serve steps
through orchestratord, against the reference runtimes over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestratord.api.app import create_app
from orchestratord.pools.config import PoolConfigError, PoolSpec, ReplicaSpec, load_pools_file
from orchestratord.pools.registry import build_registry
from orchestratord.runtime import Orchestrator
from test_harness.kakeya_runtime import SimTokenEngine, serve_kakeya
from test_harness.salience_runtime import serve_salience
from test_harness.uma_runtime import serve_uma
from tests.conftest import make_settings
from tests.helpers import make_run, read_stream, seed_on, started_client, submit, wait_status

ENGINES = ["kakeya", "salience", "uma"]
# the raw-token engines tokenize here, with the sim's vocabulary (UMA tokenizes itself)
TOKENIZER = {"kakeya": {"tokenizer": "sim"}, "salience": {"tokenizer": "sim"}}


@contextlib.asynccontextmanager
async def runtime(engine: str) -> AsyncIterator[str]:
    if engine == "kakeya":
        async with serve_kakeya() as rt:
            yield rt.address
    elif engine == "salience":
        async with serve_salience() as rt:
            yield rt.address
    else:
        async with serve_uma() as uma:
            yield f"unix:{uma.socket_path}"


@pytest.fixture(params=ENGINES)
async def client(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    engine = request.param
    prices = tmp_path / "prices"
    prices.mkdir()
    (prices / "2026-01-01.yaml").write_text(
        f'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        f"  - {{engine: {engine}, model: sim-1, free: true}}\n"
    )
    settings = make_settings(f"sqlite:///{tmp_path / 'o.db'}", price_tables_dir=prices)
    async with runtime(engine) as url:
        replica = ReplicaSpec(
            replica_id="r1", url=url, model="sim-1", slots=2, options=TOKENIZER.get(engine, {})
        )
        spec = PoolSpec(pool_id="p", engine=engine, replicas=[replica])
        orch = Orchestrator(settings, pools=build_registry([spec], settings))
        async with started_client(orch, "http://t") as c:
            yield c


async def test_a_step_runs_on_the_engine_and_streams_its_tokens(
    client: httpx.AsyncClient,
) -> None:
    (pool,) = (await client.get("/v1/pools")).json()
    seed = seed_on(pool["engine"], 5)
    run_id = await make_run(client, seed=seed)
    step_id = (await submit(client, run_id, prompt="hello there", max_tokens=12)).json()["step_id"]
    step = await wait_status(client, step_id, "succeeded", "failed")
    assert step["status"] == "succeeded", step.get("error")
    assert step["pool_id"] == "p" and step["replica_id"] == "r1"
    events = await read_stream(client, f"/v1/steps/{step_id}/stream")
    tokens = [e.data["t"] for e in events if e.event == "token" and e.data]
    assert 0 < len(tokens) <= 12 and step["usage"]["tokens_out"] == len(tokens)
    text = "".join(tokens)
    assert text == step["output"]["text"]
    # the same step in another run with the same seed gives the same tokens (Salience takes
    # no seed: its reference runtime samples with one of its own)
    again_run = await make_run(client, seed=seed)
    again = (await submit(client, again_run, prompt="hello there", max_tokens=12)).json()
    done = await wait_status(client, again["step_id"], "succeeded", "failed")
    assert done["output"]["text"] == text


@pytest.mark.parametrize("engine", ENGINES)
def test_a_replica_without_its_address_is_refused_naming_the_field(
    engine: str, tmp_path: Path
) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(
        f"pools:\n  - pool_id: p\n    engine: {engine}\n    replicas:\n      - replica_id: r1\n"
    )
    with pytest.raises(
        PoolConfigError,
        match=rf"pools\.0\.replicas\.0\.url \(line \d+\): an? {engine} replica needs its",
    ):
        load_pools_file(path)


@contextlib.asynccontextmanager
async def two_replicas(
    engine: str, tmp_path: Path
) -> AsyncIterator[tuple[Orchestrator, list[Any]]]:
    serve = serve_kakeya if engine == "kakeya" else serve_salience
    prices = tmp_path / "prices"
    prices.mkdir(exist_ok=True)
    (prices / "2026-01-01.yaml").write_text(
        f'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        f"  - {{engine: {engine}, model: sim-1, free: true}}\n"
    )
    settings = make_settings(f"sqlite:///{tmp_path / 'o.db'}", price_tables_dir=prices)
    async with serve() as rt1, serve() as rt2:
        replicas = [
            ReplicaSpec(
                replica_id=f"r{i}",
                url=rt.address,
                model="sim-1",
                slots=4,
                options={"tokenizer": "sim"},
            )
            for i, rt in enumerate((rt1, rt2), start=1)
        ]
        spec = PoolSpec(pool_id="p", engine=engine, replicas=replicas)
        orch = Orchestrator(settings, pools=build_registry([spec], settings))
        await orch.start()
        try:
            yield orch, [rt1, rt2]
        finally:
            await orch.stop()


@pytest.mark.parametrize("engine", ["kakeya", "salience"])
async def test_a_run_keeps_one_engine_session_and_sends_only_new_tokens(
    engine: str, tmp_path: Path
) -> None:
    from worker_adapters.tokenizers import SimTokenizer

    async with two_replicas(engine, tmp_path) as (orch, runtimes):
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            run_id = await make_run(client, seed=seed_on(engine, 3))
            conversation = "alpha beta "
            sent_in_full = 0
            replicas = set()
            for turn in range(4):
                step_id = (
                    await submit(
                        client, run_id, prompt=conversation, max_tokens=5, token=f"t{turn}"
                    )
                ).json()["step_id"]
                step = await wait_status(client, step_id, "succeeded", "failed")
                assert step["status"] == "succeeded", step.get("error")
                replicas.add(step["replica_id"])
                sent_in_full += len(SimTokenizer().encode(conversation))
                conversation += step["output"]["text"] + "gamma delta "
            # every turn ran on the replica holding the run's session
            assert len(replicas) == 1
            holding = [rt.store.sessions for rt in runtimes if rt.store.sessions]
            assert len(holding) == 1 and len(holding[0]) == 1  # one session, one replica
            held = holding[0]
            session = next(iter(held.values()))
            # the first prompt whole, then two words a turn: generated tokens never went back
            first = len(SimTokenizer().encode("alpha beta "))
            assert session.received == first + 3 * 2
            assert session.received < sent_in_full / 2
            # the run ends: its engine session is closed
            r = await client.post(f"/v1/runs/{run_id}/complete", json={"status": "succeeded"})
            assert r.status_code == 200, r.text
            for _ in range(100):
                if not held:
                    break
                await asyncio.sleep(0.02)
            assert held == {}


async def test_history_the_engine_drops_is_told_on_the_step_stream(tmp_path: Path) -> None:
    prices = tmp_path / "prices"
    prices.mkdir()
    (prices / "2026-01-01.yaml").write_text(
        'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        "  - {engine: kakeya, model: sim-1, free: true}\n"
    )
    settings = make_settings(f"sqlite:///{tmp_path / 'o.db'}", price_tables_dir=prices)
    async with serve_kakeya(sink=2, window=24) as rt:
        replica = ReplicaSpec(
            replica_id="r1", url=rt.address, model="sim-1", options={"tokenizer": "sim"}
        )
        spec = PoolSpec(pool_id="p", engine="kakeya", replicas=[replica])
        orch = Orchestrator(settings, pools=build_registry([spec], settings))
        await orch.start()
        try:
            transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                run_id = await make_run(client)
                step_id = (await submit(client, run_id, prompt="plan " * 30)).json()["step_id"]
                step = await wait_status(client, step_id, "succeeded", "failed")
                events = await read_stream(client, f"/v1/steps/{step_id}/stream")
        finally:
            await orch.stop()
    assert step["status"] == "succeeded"
    told = [e.data["text"] for e in events if e.event == "narration" and e.data]
    assert told[0].startswith("placed on ")
    assert told[1:] == [
        "the engine dropped 4 tokens of the run's session history to fit its window "
        "(its stop reason: STOP_REASON_TRUNCATED)"
    ]


async def test_strict_replay_of_a_session_run_on_kakeya_is_identical(tmp_path: Path) -> None:
    """A multi-turn run recorded on a Kakeya pool (its steps sharing one engine session) is
    re-executed by strict_replay in a fresh session: token for token the same."""
    async with two_replicas("kakeya", tmp_path) as (orch, runtimes):
        transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            flow_id = (await client.post("/v1/flows", json={"ast": {"k": 1}})).json()["flow_id"]
            source = await make_run(client, flow_id, seed=9)
            prompts, conversation = [], "alpha beta "
            for turn in range(3):
                prompts.append(conversation)
                step_id = (
                    await submit(client, source, f"t{turn}", conversation, max_tokens=6)
                ).json()["step_id"]
                step = await wait_status(client, step_id, "succeeded", "failed")
                assert step["status"] == "succeeded", step.get("error")
                conversation += step["output"]["text"] + "gamma "
            r = await client.post(
                f"/v1/flows/{flow_id}/runs", json={"mode": "strict_replay", "source_run_id": source}
            )
            assert r.status_code == 201, r.text
            strict = r.json()["run_id"]
            for turn, prompt in enumerate(prompts):
                step_id = (await submit(client, strict, f"t{turn}", prompt, max_tokens=6)).json()[
                    "step_id"
                ]
                step = await wait_status(client, step_id, "succeeded", "failed")
                assert step["status"] == "succeeded", step.get("error")
            report = (await client.get(f"/v1/runs/{strict}/replay-report")).json()
    assert report["diverged"] is False and report["counts"]["identical"] == 3
    # each run has its own engine session (neither run has ended, so both are open)
    assert sum(len(rt.store.sessions) for rt in runtimes) == 2


@contextlib.asynccontextmanager
async def served_pool(
    engine: str, tmp_path: Path, url: str, options: dict[str, Any]
) -> AsyncIterator[httpx.AsyncClient]:
    """One replica at ``url`` read from a pools file, as the server starts it."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        f"pools:\n  - pool_id: p\n    engine: {engine}\n    price: {{free: true}}\n"
        f"    replicas:\n      - replica_id: r1\n        url: {url}\n        options: {options}\n"
    )
    settings = make_settings(f"sqlite:///{tmp_path / 'o.db'}", pools_file=pools)
    orch = Orchestrator(settings)
    async with started_client(orch, "http://t") as client:
        yield client


@pytest.mark.parametrize("engine", ["kakeya", "salience"])
async def test_a_grpc_url_reaches_the_engine_at_its_host_and_port(
    engine: str, tmp_path: Path
) -> None:
    """The contract's ``url: grpc://host:port`` serves a step (it was read as a target name
    gRPC could not resolve, and the replica was down)."""
    serve = serve_kakeya if engine == "kakeya" else serve_salience
    async with serve() as rt:
        url = f"grpc://{rt.address}"
        async with served_pool(engine, tmp_path, url, {"tokenizer": "sim"}) as client:
            (pool,) = (await client.get("/v1/pools")).json()
            run_id = await make_run(client, seed=seed_on(engine, 5))
            step_id = (await submit(client, run_id, prompt="alpha beta", max_tokens=4)).json()[
                "step_id"
            ]
            await read_stream(client, f"/v1/steps/{step_id}/stream")
            step = (await client.get(f"/v1/steps/{step_id}")).json()
        assert len(rt.store.sessions) == 1  # the run's session, on this engine
    (replica,) = pool["replicas"]
    assert pool["health"] == "ready", replica["health"]
    assert replica["url"] == url  # shown as written
    assert step["status"] == "succeeded", step.get("error")
    assert 0 < step["usage"]["tokens_out"] <= 4


needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed"
)


@needs_llama
@pytest.mark.parametrize("engine", ["kakeya", "salience"])
async def test_the_packaged_tokenizer_is_the_packaged_gguf_s_vocabulary(
    engine: str, tmp_path: Path
) -> None:
    """``options.tokenizer: packaged`` (the contract's name) tokenizes as ``gguf`` does: with
    the packaged Gemma 3 270M's vocabulary, whose file's hash identifies the model."""
    from worker_adapters.llama import default_model_path, file_sha256
    from worker_adapters.tokenizers import LlamaTokenizer, tokenizer_named

    vocabulary = tokenizer_named("packaged")  # read once, shared with the replicas
    assert isinstance(vocabulary, LlamaTokenizer)
    engine_side = SimTokenEngine()
    engine_side.vocab_size = vocabulary.vocab_size  # takes the Gemma ids the prompt becomes
    runtime = (
        serve_kakeya(engine=engine_side)
        if engine == "kakeya"
        else serve_salience(engine=engine_side, model="gemma-3-270m")
    )
    async with runtime as rt:
        options = {"tokenizer": "packaged"}
        async with served_pool(engine, tmp_path, rt.address, options) as client:
            (pool,) = (await client.get("/v1/pools")).json()
            run_id = await make_run(client, seed=seed_on(engine, 42))
            step_id = (await submit(client, run_id, prompt="The sky is", max_tokens=2)).json()[
                "step_id"
            ]
            await read_stream(client, f"/v1/steps/{step_id}/stream")
            step = (await client.get(f"/v1/steps/{step_id}")).json()
            (session,) = rt.store.sessions.values()
            received = list(session.tokens)
    assert step["status"] == "succeeded", step.get("error")
    prompt = vocabulary.encode("The sky is")
    assert received[: len(prompt)] == prompt
    assert pool["capabilities"]["model_hash"] == file_sha256(default_model_path())
    assert pool["capabilities"]["model"] == "gemma-3-270m"
