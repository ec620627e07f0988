"""A cancel always reaches the engine: for each engine protocol, fifty steps cancelled over
HTTP at varying points of their streams each end ``cancelled``, and the engine's own fake or
reference runtime counts fifty generations cut short (none streams on to its end). The
in-process engines (sim, and llama on the real local model) count their own."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from test_harness.cancel_counting import (
    PROTOCOLS,
    Engine,
    counting_engine,
    free_prices,
    pools_file,
    until_busy,
)
from tests.conftest import make_settings
from tests.helpers import make_run, started_client, wait_status

CANCELS = 50
BOUND_S = 30  # a bound on waiting for the engine's count, never an assertion on time


def _settings(name: str, eng: Engine, db_url: str, tmp_path: Path, gguf: Path | None) -> Settings:
    prices = free_prices(tmp_path)
    if eng.replica is None:
        return make_settings(
            db_url,
            engine=name,
            sim={"tokens_per_s": 2000},
            llama_model_path=gguf,
            price_tables_dir=prices,
        )
    pools = pools_file(name, eng, tmp_path)
    return make_settings(db_url, pools_file=pools, price_tables_dir=prices)


@pytest.mark.parametrize("name", PROTOCOLS)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_fifty_cancels_each_reach_the_engine(
    name: str, db_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(name)
    gguf = request.getfixturevalue("gguf") if name == "llama" else None
    async with counting_engine(name, tmp_path) as eng:
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
