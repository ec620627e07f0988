"""Claim rounds: each costs a write transaction, so the dispatcher runs one when steps may
be waiting, not after every step that ends. The dispatcher's poll is set long here, so a
round that should have run and did not shows as a step that never starts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from orchestratord import dispatcher
from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from test_harness.servers import serve_app
from tests.conftest import make_settings
from tests.helpers import make_run, submit, wait_status

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The pool of every claim round the dispatcher runs."""
    seen: list[str | None] = []
    claim = dispatcher.claim_queued

    async def counted(session: Any, *, pool_id: str | None, **kw: Any) -> Any:
        seen.append(pool_id)
        return await claim(session, pool_id=pool_id, **kw)

    monkeypatch.setattr(dispatcher, "claim_queued", counted)
    return seen


async def _client(db_url: str, slots: int) -> AsyncIterator[httpx.AsyncClient]:
    orch = Orchestrator(make_settings(db_url, dispatch={"poll_s": 60.0}, sim={"slots": slots}))
    await orch.start()
    try:
        async with (
            serve_app(create_app(orchestrator=orch)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as c,
        ):
            yield c
    finally:
        await orch.stop()


@pytest.fixture
async def one_slot(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(db_url, 1):
        yield c


@pytest.fixture
async def slots(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(db_url, 8):
        yield c


async def test_an_ended_step_leaves_no_empty_claim_round(
    slots: httpx.AsyncClient, rounds: list[str | None]
) -> None:
    run_id = await make_run(slots)
    step_id = (await submit(slots, run_id, token="warm", max_tokens=2)).json()["step_id"]
    await wait_status(slots, step_id, "succeeded")
    rounds.clear()
    for i in range(5):
        step_id = (await submit(slots, run_id, token=f"t{i}", max_tokens=2)).json()["step_id"]
        await wait_status(slots, step_id, "succeeded")
    pool_rounds = [p for p in rounds if p is not None]
    # one round per submission (a slow health check may add one), not one more per ended step
    assert 5 <= len(pool_rounds) <= 6, pool_rounds


async def test_steps_queued_behind_a_full_pool_start_as_slots_free(
    one_slot: httpx.AsyncClient,
) -> None:
    run_id = await make_run(one_slot)
    ids = [
        (await submit(one_slot, run_id, token=f"t{i}", max_tokens=4)).json()["step_id"]
        for i in range(4)
    ]
    for step_id in ids:  # each within wait_status's 10 s, far less than the 60 s poll
        await wait_status(one_slot, step_id, "succeeded")
