"""The evaluating processes (``orchestratord.gates.pool``): a value or the expression's own
error from a warm process; an evaluation past its memory cap or its deadline fails naming
the reason, and the next one gets a fresh process; a cancelled evaluation ends its process;
none of the server's environment reaches them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchestrator_core.gates import GateExprInvalid, compile_gate
from orchestratord.gates.pool import CelPool
from orchestratord.settings import CelSettings

# 15 strings of twice the fact: within the static estimate (60 copies), 240 MB of 8 MB facts
DOUBLED = f"{list(range(15))}.map(x, facts[0].data.s + facts[0].data.s).size() > 0"
# cel-cpp copies a map's list at each step: 9,999 elements are ~50M copies (~15 s, 1.6 GB)
ACCUMULATING = "facts[0].data.l.map(x, x).size() > 0"


def payload(expr: str, *data: Any) -> bytes:
    facts = [{"type": "t", "data": d, "step_id": None, "ts": "2026-01-01T00:00:00"} for d in data]
    return orjson.dumps({"expr": expr, "run": {"run_id": "run_a"}, "facts": facts})


@pytest.fixture
async def pools() -> AsyncIterator[Callable[..., CelPool]]:
    """Pools with the settings asked (``pools(memory_mb=256)``), closed after the test."""
    made: list[CelPool] = []

    def make(**settings: Any) -> CelPool:
        made.append(CelPool(CelSettings(**settings)))
        return made[-1]

    try:
        yield make
    finally:
        for p in made:
            await p.aclose()


async def test_a_warm_process_answers_each_evaluation(pools: Callable[..., CelPool]) -> None:
    pool = pools()
    yes, no = compile_gate("size(facts) == 1"), compile_gate("size(facts) == 2")
    assert await pool.evaluate(yes, payload(yes.expr, 1)) is True
    assert await pool.evaluate(no, payload(no.expr, 1)) is False
    assert (pool.evaluations, pool.started) == (2, 1)


async def test_the_expressions_own_failure_keeps_the_process(
    pools: Callable[..., CelPool],
) -> None:
    pool = pools()
    gate = compile_gate("facts[0].data.missing == 1")
    with pytest.raises(GateExprInvalid) as caught:
        await pool.evaluate(gate, payload(gate.expr, {}))
    assert caught.value.details == {"expr": gate.expr}
    assert "missing" in caught.value.message
    assert await pool.evaluate(compile_gate("true"), payload("true")) is True
    assert pool.started == 1


async def test_an_evaluation_past_its_memory_fails_and_the_next_gets_a_fresh_process(
    pools: Callable[..., CelPool],
) -> None:
    pool = pools(memory_mb=256, workers=1)
    gate = compile_gate(DOUBLED)
    body = payload(DOUBLED, {"s": "x" * (8 << 20)})
    with pytest.raises(GateExprInvalid) as caught:
        await pool.evaluate(gate, body)
    assert caught.value.details == {"expr": DOUBLED, "reason": "memory", "limit_mb": 256}
    small = payload(DOUBLED, {"s": "x"})
    assert await pool.evaluate(gate, small) is True
    assert pool.started == 2


async def test_an_evaluation_past_its_deadline_fails_and_its_process_is_killed(
    pools: Callable[..., CelPool],
) -> None:
    pool = pools(deadline_s=0.5, memory_mb=4096, workers=1)
    gate = compile_gate(ACCUMULATING)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(GateExprInvalid) as caught:
        await pool.evaluate(gate, payload(ACCUMULATING, {"l": list(range(9999))}))
    assert caught.value.details == {"expr": ACCUMULATING, "reason": "deadline", "limit_s": 0.5}
    assert loop.time() - started < 10  # not the ~15 s the evaluation would take
    assert await pool.evaluate(gate, payload(ACCUMULATING, {"l": [1]})) is True
    assert pool.started == 2


async def test_a_cancelled_evaluation_ends_its_process(pools: Callable[..., CelPool]) -> None:
    pool = pools(workers=1)
    gate = compile_gate(ACCUMULATING)
    task = asyncio.ensure_future(pool.evaluate(gate, payload(ACCUMULATING, {"l": [0] * 9999})))
    while pool.evaluations == 0:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await pool.evaluate(compile_gate("true"), payload("true")) is True  # a fresh one
    assert pool.started == 2


async def test_the_servers_environment_does_not_reach_an_evaluating_process(
    pools: Callable[..., CelPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = pools()
    monkeypatch.setenv("ORCHESTRATORD_AUTH__PEPPER", "pepper-not-for-expressions")
    assert await pool.evaluate(compile_gate("true"), payload("true")) is True
    (worker,) = pool._idle
    environ = Path(f"/proc/{worker.proc.pid}/environ").read_bytes()
    assert b"ORCHESTRATORD" not in environ and b"pepper" not in environ
