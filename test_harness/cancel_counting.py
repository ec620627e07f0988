"""Engines of every protocol that count the generations cut short, for cancel tests and
benches: the fake or reference runtime of each protocol (openai, kakeya, salience, uma,
evergreen) counts cancels as the engine sees them; the in-process engines (sim, llama) count
their own (``cut_short``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from test_harness.evergreen_runtime import serve_evergreen
from test_harness.fake_openai import FakeState, Faults, create_fake_openai
from test_harness.kakeya_runtime import SimTokenEngine, serve_kakeya
from test_harness.salience_runtime import serve_salience
from test_harness.servers import serve_app
from test_harness.uma_runtime import serve_uma
from worker_adapters.sim import SimAdapter

PROTOCOLS = ("sim", "llama", "openai", "kakeya", "salience", "uma", "evergreen")


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
async def counting_engine(name: str, tmp_path: Path) -> AsyncIterator[Engine]:
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


async def until_busy(eng: Engine, busy: bool, *, bound_s: float = 30) -> None:
    """Until the engine streams a generation (``busy``) or streams none."""
    for _ in range(int(bound_s * 100)):
        if eng.busy() == busy:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine " + ("never started" if busy else "never stopped"))


def pools_file(name: str, eng: Engine, directory: Path) -> Path:
    """A pools file of one pool ``p`` of the engine (not for the in-process engines)."""
    path = directory / "pools.yaml"
    path.write_text(
        f"pools:\n  - pool_id: p\n    engine: {name}\n"
        f"    replicas: [{{replica_id: r0, slots: 4, {eng.replica}}}]\n"
    )
    return path


def free_prices(directory: Path) -> Path:
    """A price table directory whose models are all free (no cost budget in the way)."""
    prices = directory / "prices"
    prices.mkdir()
    (prices / "2026-01-01.yaml").write_text('version: "2026-01-01"\nunpriced: free\nentries: []\n')
    return prices
