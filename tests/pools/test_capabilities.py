"""The capability snapshot (``GET /capabilities``, ``GET /v1/capabilities``) and what
``GET /v1/pools`` shows of each pool's and replica's capabilities: a real server process in
front of a real OpenAI-compatible engine (the fake one) and the simulated engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from contracts import capabilities as contract
from orchestratord import __version__
from orchestratord.cli import main
from orchestratord.pools.config import PoolConfigError, load_pools_file
from orchestratord.pools.registry import build_registry
from orchestratord.runtime import Orchestrator
from test_harness.fake_openai import FakeState, create_fake_openai
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import started_client
from tests.procs import free_port, orchestratord

PATHS = ("/capabilities", "/v1/capabilities")

TWO_POOLS = """\
pools:
  - pool_id: gpu-a
    engine: openai
    gpu: {{arch: sm90, vram_gib: 80, count: 2}}
    replicas:
      - replica_id: v1
        url: {engine}/v1
        model: fake-model
        slots: 2
      - replica_id: v0
        url: {engine}/v1
        model: fake-model
        gpu:
          arch: sm80
          vram_gib: 40
          name: NVIDIA A100 40GB
          driver: "550.54"
  - pool_id: cpu-b
    engine: sim
    replicas:
      - replica_id: r0
        model: beta
        slots: 3
        options: {{context_size: 4096}}
"""


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(contract.SCHEMA_PATH.read_text())
    return loaded


def assert_sorted(snapshot: dict[str, Any]) -> None:
    """Every array sorted by its key, as the CLI generates code from them."""
    keys = [w["workload"] for w in snapshot["workloads"]]
    assert keys == sorted(keys)
    for workload in snapshot["workloads"]:
        assert workload["supported_models"] == sorted(workload["supported_models"])
    ids = [m["id"] for m in snapshot["models"]]
    assert ids == sorted(ids)
    gpus = [g["id"] for g in snapshot["hardware"]["gpus"]]
    assert gpus == sorted(gpus)
    names = [t["name"] for t in snapshot.get("tools") or []]
    assert names == sorted(names)


def in_step_with(snapshot: dict[str, Any], pools: list[dict[str, Any]]) -> None:
    """The snapshot says what ``GET /v1/pools`` says: the models each replica serves, with
    the largest context it reports; the GPUs each declares, by id; every replica's slots."""
    contexts: dict[str, int] = {}
    gpus: dict[str, int] = {}
    for pool in pools:
        for replica in pool["replicas"]:
            caps = replica["capabilities"]
            for model in caps["models"]:
                contexts[model] = max(contexts.get(model, 0), caps["context_size"] or 0)
            if caps["gpu"] is not None:
                for n in range(caps["gpu"]["count"]):
                    gpus[f"{pool['pool_id']}/{replica['replica_id']}/gpu{n}"] = caps["gpu"][
                        "vram_gib"
                    ]
    assert {m["id"]: m["ctx_max"] for m in snapshot["models"]} == contexts
    assert {g["id"]: g["memory_gb"] for g in snapshot["hardware"]["gpus"]} == gpus
    assert snapshot["limits"]["ctx_max"] == max(contexts.values(), default=0)
    slots = sum(r["slots"] for p in pools for r in p["replicas"])
    assert snapshot["limits"]["max_concurrent_requests"] == slots
    for workload in snapshot["workloads"]:
        assert set(workload["supported_models"]) <= set(contexts)


@dataclass
class Served:
    client: httpx.AsyncClient
    key: str


@pytest.fixture
async def served(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Served]:
    """``orchestratord serve --pools`` in its own process, keys on, with an OpenAI-compatible
    engine (served in this test's event loop) in one pool and the simulated one in another."""
    async with serve_app(create_fake_openai(FakeState())) as engine:
        pools = tmp_path / "pools.yaml"
        pools.write_text(TWO_POOLS.format(engine=engine))
        url = f"sqlite:///{tmp_path / 'o.db'}"
        env = {
            "ORCHESTRATORD_ADMISSION__INTERACTIVE_CAPACITY": "10",
            "ORCHESTRATORD_ADMISSION__BATCH_CAPACITY": "20",
        }
        # a key made as an operator makes one: from then on keys are required
        made = ["keys", "create", "--scope", "read", "--database-url", url]
        assert await asyncio.to_thread(main, made) == 0  # the CLI runs its own event loop
        key = capsys.readouterr().out.strip()
        with contextlib.ExitStack() as stack:
            server = orchestratord(tmp_path, "--database-url", url, "--pools", str(pools), env=env)
            # started on a thread: the engine answers the server's first look from this loop
            base = await asyncio.to_thread(stack.enter_context, server)
            try:
                async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                    yield Served(client, key)
            finally:
                await asyncio.to_thread(stack.close)


@pytest.mark.slow
async def test_the_snapshot_from_a_real_server(served: Served) -> None:
    client, auth = served.client, {"Authorization": f"Bearer {served.key}"}
    for path in PATHS:  # a key is required, as on every route but health
        refused = await client.get(path)
        assert refused.status_code == 401, refused.text
        assert refused.json()["code"] == "UNAUTHENTICATED"
    answers = [await client.get(path, headers=auth) for path in PATHS]
    pools = (await client.get("/v1/pools", headers=auth)).json()
    validator = jsonschema.Draft202012Validator(schema())
    for r in answers:
        assert r.status_code == 200, r.text
        assert r.headers["cache-control"] == "no-store"
        body = r.json()
        validator.validate(body)
        assert_sorted(body)
        in_step_with(body, pools)
    first, second = (r.json() for r in answers)
    assert first["captured_at"] <= second["captured_at"]
    assert {**first, "captured_at": None} == {**second, "captured_at": None}

    assert first["metadata"] == {
        "engine": "orchestratord",
        "version": contract.SNAPSHOT_VERSION,
        "build": __version__,
    }
    # the OpenAI-compatible engine reports its context (vLLM's max_model_len), the simulated
    # one the size its options give; tool calls where output is held to a JSON Schema
    assert first["models"] == [
        {
            "id": "beta",
            "modality": "text",
            "ctx_max": 4096,
            "max_tokens_out": 4096,
            "supports_tool_calls": True,
            "supports_parallel_functions": True,
        },
        {
            "id": "fake-model",
            "modality": "text",
            "ctx_max": 2048,
            "max_tokens_out": 2048,
            "supports_tool_calls": True,
            "supports_parallel_functions": True,
        },
    ]
    assert first["limits"] == {
        "ctx_max": 4096,
        "max_tokens_out": 131072,
        "max_concurrent_requests": 6,
        "queue_depth_limit": 30,
    }
    assert [(w["workload"], w["supported_models"]) for w in first["workloads"]] == [
        ("chat", ["beta", "fake-model"]),
        ("completion", ["beta", "fake-model"]),
        ("tool", ["beta", "fake-model"]),
    ]
    # the pool's gpu is its replicas' unless one declares its own
    assert first["hardware"] == {
        "gpus": [
            {
                "id": "gpu-a/v0/gpu0",
                "vendor": "nvidia",
                "name": "NVIDIA A100 40GB",
                "memory_gb": 40,
                "driver": "550.54",
                "arch": "sm80",
            },
            {
                "id": "gpu-a/v1/gpu0",
                "vendor": "nvidia",
                "name": "sm90 80 GiB",
                "memory_gb": 80,
                "arch": "sm90",
            },
            {
                "id": "gpu-a/v1/gpu1",
                "vendor": "nvidia",
                "name": "sm90 80 GiB",
                "memory_gb": 80,
                "arch": "sm90",
            },
        ]
    }
    assert first["tools"] == []

    # GET /v1/pools: per replica and summed per pool
    by_id = {p["pool_id"]: p for p in pools}
    gpu_pool, cpu_pool = by_id["gpu-a"], by_id["cpu-b"]
    assert gpu_pool["capabilities"]["gpu"] == {"arch": None, "vram_gib": 40, "count": 3}
    assert gpu_pool["capabilities"]["models"] == ["fake-model"]
    assert gpu_pool["capabilities"]["context_size"] == 2048
    assert cpu_pool["capabilities"]["gpu"] is None
    assert cpu_pool["capabilities"]["context_size"] == 4096
    replicas = {r["replica_id"]: r["capabilities"] for r in gpu_pool["replicas"]}
    assert replicas["v1"]["gpu"] == {"arch": "sm90", "vram_gib": 80, "count": 2}
    assert replicas["v0"]["gpu"] == {"arch": "sm80", "vram_gib": 40, "count": 1}
    assert replicas["v0"]["models"] == ["fake-model"]
    assert "json_schema" in replicas["v0"]["features"]
    assert "base_url" not in replicas["v0"]  # addresses are shown scrubbed, pool-wide only
    assert gpu_pool["load"] == {"slots_busy": 0, "slots_free": 3, "queue_depth": 0}


async def test_a_pool_whose_engine_is_down_shows_what_is_declared(tmp_path: Path) -> None:
    """Before an engine answers, the snapshot holds what the pools file says: the model by
    name with no context known, no tool calls (the engine's features are not known), and
    its GPUs."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n"
        "  - pool_id: far\n"
        "    engine: openai\n"
        "    replicas:\n"
        "      - replica_id: r0\n"
        f"        url: http://127.0.0.1:{free_port()}/v1\n"  # nothing listens there
        "        model: remote-70b\n"
        "        gpu: {arch: gfx942, vram_gib: 192, count: 8}\n"
    )
    settings = make_settings(f"sqlite:///{tmp_path / 'o.db'}", pools_file=pools)
    async with started_client(Orchestrator(settings), "http://t") as client:
        r = await client.get("/v1/capabilities")
        listed = (await client.get("/v1/pools")).json()
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    body = r.json()
    jsonschema.Draft202012Validator(schema()).validate(body)
    in_step_with(body, listed)
    assert body["models"] == [
        {
            "id": "remote-70b",
            "modality": "text",
            "ctx_max": 0,
            "supports_tool_calls": False,
            "supports_parallel_functions": False,
        }
    ]
    assert body["limits"]["ctx_max"] == 0
    assert [w["workload"] for w in body["workloads"]] == ["chat", "completion"]
    assert body["workloads"][0]["default_model"] == "remote-70b"  # the one model
    gpus = body["hardware"]["gpus"]
    assert [g["id"] for g in gpus] == [f"far/r0/gpu{n}" for n in range(8)]
    assert {(g["vendor"], g["memory_gb"], g["arch"]) for g in gpus} == {("amd", 192, "gfx942")}
    assert listed[0]["health"] == "down"
    assert listed[0]["replicas"][0]["capabilities"]["context_size"] is None


def test_runtime_pools_expose_the_declared_memory(tmp_path: Path) -> None:
    """What placement selectors read: a replica's GPU memory and ids, a pool's smallest."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n"
        "  - pool_id: mixed\n"
        "    engine: sim\n"
        "    gpu: {arch: sm89, vram_gib: 24}\n"
        "    replicas:\n"
        "      - {replica_id: small}\n"
        "      - {replica_id: big, gpu: {arch: sm90, vram_gib: 80, count: 2}}\n"
        "  - pool_id: bare\n"
        "    engine: sim\n"
        "    replicas: [{replica_id: r0}]\n"
    )
    registry = build_registry(load_pools_file(pools), make_settings("sqlite://"))
    mixed, bare = registry.require("mixed"), registry.require("bare")
    small, big = mixed.replicas
    assert (small.vram_gib, small.gpu_ids) == (24, ("mixed/small/gpu0",))
    assert (big.vram_gib, big.gpu_ids) == (80, ("mixed/big/gpu0", "mixed/big/gpu1"))
    assert mixed.vram_gib == 24
    assert bare.vram_gib is None and bare.replicas[0].gpu_ids == ()


BAD_GPU = """\
pools:
  - pool_id: p
    engine: sim
    replicas:
      - replica_id: r0
        gpu: {gpu}
"""


@pytest.mark.parametrize(
    ("gpu", "field", "says"),
    [
        ("{arch: sm90, vram_gib: 79.5}", "gpu.vram_gib", "valid integer"),
        ('{arch: sm90, vram_gib: "80"}', "gpu.vram_gib", "valid integer"),
        ("{arch: sm90, vram_gib: 0}", "gpu.vram_gib", "greater than or equal to 1"),
        ("{arch: sm90, vram_gib: 80, count: 0}", "gpu.count", "greater than or equal to 1"),
        ("{vram_gib: 80}", "gpu.arch", "Field required"),
        ("{arch: sm90}", "gpu.vram_gib", "Field required"),
        ("{arch: sm90, vram_gib: 80, memory: 80}", "gpu.memory", "Extra inputs"),
        ("80", "gpu", "valid dictionary"),
    ],
)
def test_a_bad_gpu_declaration_is_refused_naming_the_field_and_line(
    tmp_path: Path, gpu: str, field: str, says: str
) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(BAD_GPU.format(gpu=gpu))
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: pools.0.replicas.0.{field} (line 6): "), message
    assert says in message


def test_a_bad_pool_gpu_is_refused_on_its_line(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(
        "pools:\n"
        "  - pool_id: p\n"
        "    engine: sim\n"
        "    gpu:\n"
        "      arch: sm90\n"
        "      vram_gib: -4\n"
        "    replicas: [{replica_id: r0}]\n"
    )
    with pytest.raises(PoolConfigError) as info:
        load_pools_file(path)
    assert str(info.value).startswith(f"{path}: pools.0.gpu.vram_gib (line 6): ")


def test_the_committed_schema_is_the_contract_s() -> None:
    assert contract.SCHEMA_PATH.read_text() == contract.render(), (
        "run python -m contracts.capabilities"
    )
    jsonschema.Draft202012Validator.check_schema(schema())


def test_the_contract_sorts_what_it_is_given() -> None:
    gpu = {"vendor": "v", "name": "n", "memory_gb": 1}
    model = {
        "modality": "text",
        "ctx_max": 1,
        "supports_tool_calls": False,
        "supports_parallel_functions": False,
    }
    snapshot = contract.CapabilitySnapshot.model_validate(
        {
            "metadata": {"engine": "e", "version": "2026.11"},
            "limits": {"ctx_max": 1},
            "workloads": [
                {"workload": w, "supported_models": ["b", "a", "b"], "supports_guardrails": True}
                for w in ("tool", "chat")
            ],
            "models": [{"id": i, **model} for i in ("b", "a")],
            "hardware": {"gpus": [{"id": i, **gpu} for i in ("p/r/gpu1", "p/r/gpu0")]},
            "tools": [{"name": "z"}, {"name": "y"}],
            "captured_at": "2026-11-26T12:00:00Z",
        }
    )
    shown = snapshot.model_dump(exclude_none=True)
    assert_sorted(shown)
    assert shown["workloads"][0]["supported_models"] == ["a", "b"]
    jsonschema.Draft202012Validator(schema()).validate(shown)
