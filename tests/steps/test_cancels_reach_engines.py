"""A cancel always reaches the engine: for each engine protocol, fifty steps cancelled over
HTTP at varying points of their streams each end ``cancelled``, and the engine's own fake or
reference runtime counts fifty generations cut short (none streams on to its end). The
in-process engines (sim, and llama on the real local model) count their own."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from test_harness.evergreen_runtime import serve_evergreen
from test_harness.fake_openai import FakeState, Faults, create_fake_openai
from test_harness.kakeya_runtime import SimTokenEngine, serve_kakeya
from test_harness.salience_runtime import serve_salience
from test_harness.servers import serve_app
from test_harness.uma_runtime import serve_uma
from tests.conftest import make_settings
from tests.helpers import make_run, started_client, wait_status
from worker_adapters.sim import SimAdapter

CANCELS = 50
BOUND_S = 30  # a bound on waiting for the engine's count, never an assertion on time


@dataclass
class Engine:
    replica: str | None  # the pools file's replica line, minus its id; None: in process
    cancelled: Callable[[], int]  # generations the engine saw cut short
    busy: Callable[[], bool]  # a generation streams now
    local: list[Any] = field(default_factory=list)  # the in-process engine, once started


def in_process() -> Engine:
    """The engine of ``settings.engine`` (pool ``local``), found once the server started."""
    local: list[Any] = []
    return Engine(
        None,
        lambda: int(local[0].cut_short),
        lambda: bool(local[0].busy if hasattr(local[0], "busy") else local[0].active_requests),
        local,
    )


@contextlib.asynccontextmanager
async def engine(name: str, tmp_path: Path) -> AsyncIterator[Engine]:
    if name in ("sim", "llama"):
        yield in_process()
    elif name == "openai":
        state = FakeState(faults=Faults(token_delay_s=0.002))
        async with serve_app(create_fake_openai(state)) as url:
            yield Engine(
                f"url: '{url}/v1', model: fake-model",
                lambda: state.disconnects,
                lambda: state.active > 0,
            )
    elif name == "kakeya":
        async with serve_kakeya(engine=SimTokenEngine(tokens_per_s=2000)) as rt:
            yield Engine(
                f"url: '{rt.address}', model: sim-1, options: {{tokenizer: sim}}",
                lambda: rt.store.cancelled,
                lambda: any(s.busy for s in rt.store.sessions.values()),
            )
    elif name == "salience":
        async with serve_salience(engine=SimTokenEngine(tokens_per_s=2000)) as rt:
            yield Engine(
                f"url: '{rt.address}', model: sim-1, options: {{tokenizer: sim}}",
                lambda: rt.store.cancelled,
                lambda: any(s.busy for s in rt.store.sessions.values()),
            )
    elif name == "uma":
        sim = SimAdapter(tokens_per_s=2000, eos_probability=0.0)
        async with serve_uma(engine=sim, socket_path=tmp_path / "uma.sock") as rt:
            yield Engine(
                f"url: 'unix:{rt.socket_path}', model: sim-1",
                # cut short: a cancel frame, or the connection closed under it
                lambda: sum(1 for o in rt.stats.outcomes.values() if not o.startswith("eos:")),
                lambda: len(rt.stats.requests) > len(rt.stats.outcomes),
            )
    else:  # evergreen
        sim = SimAdapter(tokens_per_s=2000, eos_probability=0.0)
        async with serve_evergreen(engine=sim) as rt:
            yield Engine(
                f"url: 'grpc://{rt.address}', model: sim-1",
                lambda: rt.counters.cancelled,
                lambda: any(s.busy for s in rt.service.sessions),
            )


async def until_busy(eng: Engine, busy: bool) -> None:
    """Until the engine streams a generation (``busy``) or streams none."""
    for _ in range(BOUND_S * 100):
        if eng.busy() == busy:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine " + ("never started" if busy else "never stopped"))


def _settings(name: str, eng: Engine, db_url: str, tmp_path: Path, gguf: Path | None) -> Settings:
    prices = tmp_path / "prices"
    prices.mkdir()
    (prices / "2026-01-01.yaml").write_text('version: "2026-01-01"\nunpriced: free\nentries: []\n')
    if eng.replica is None:
        return make_settings(
            db_url,
            engine=name,
            sim={"tokens_per_s": 2000},
            llama_model_path=gguf,
            price_tables_dir=prices,
        )
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        f"pools:\n  - pool_id: p\n    engine: {name}\n"
        f"    replicas: [{{replica_id: r0, slots: 4, {eng.replica}}}]\n"
    )
    return make_settings(db_url, pools_file=pools, price_tables_dir=prices)


@pytest.mark.parametrize(
    "name", ["sim", "llama", "openai", "kakeya", "salience", "uma", "evergreen"]
)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_fifty_cancels_each_reach_the_engine(
    name: str, db_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(name)
    gguf = request.getfixturevalue("gguf") if name == "llama" else None
    async with engine(name, tmp_path) as eng:
        orch = Orchestrator(_settings(name, eng, db_url, tmp_path, gguf))
        async with started_client(orch) as client:
            pool = orch.pools.get("local")
            if eng.replica is None and pool is not None:
                eng.local.append(pool.replicas[0].adapter)
            run_id = await make_run(client)
            for n in range(CANCELS):
                await until_busy(eng, False)  # the last one stopped
                body = {
                    "type": "llm_call",
                    "client_token": f"c{n}",
                    "input": {
                        "prompt": f"say {n}",
                        "params": {"max_tokens": 100_000, "temperature": 0},
                    },
                }
                r = await client.post(f"/v1/runs/{run_id}/steps", json=body)
                assert r.status_code == 202, r.text
                step_id = r.json()["step_id"]
                await until_busy(eng, True)  # it streams: a cancel has to reach it
                await asyncio.sleep(rng.uniform(0.0, 0.04))  # a varying point of the stream
                await client.post(f"/v1/steps/{step_id}/cancel")
                ended = await wait_status(client, step_id, "cancelled", "succeeded", "failed")
                assert ended["status"] == "cancelled", (n, ended.get("error"))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + BOUND_S
            while eng.cancelled() < CANCELS and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert eng.cancelled() == CANCELS
