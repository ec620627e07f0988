"""Runs a process has read before, taken without reading them again (PostgreSQL); and a
submission's races with another process's change to its run.

The statement that stores the step checks what a read would have seen; whatever it (or a
rule) finds that only a fresh read decides starts the submission again from a read. Here
each change is made behind the process's back, as another process would make it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestratord.db.models import Run, Step
from orchestratord.runs.kept import KeptRuns
from orchestratord.runtime import Orchestrator
from test_harness.perturbed import PerturbedAdapter
from tests.helpers import make_run, submit, wait_status
from worker_adapters.base import Health


@pytest.fixture
def kept(orch: Orchestrator) -> KeptRuns:
    if orch.db.is_sqlite:
        pytest.skip("SQLite reads the run in-process: no run is kept")
    return orch.submit_context.runs


async def kept_run(client: httpx.AsyncClient, kept: KeptRuns, **body: Any) -> tuple[str, str]:
    """A run with one step that succeeded (2 tokens): the process has read it."""
    run_id = await make_run(client, **body)
    first = await submit(client, run_id, token="first", max_tokens=2)
    assert first.status_code == 202, first.text
    await wait_status(client, first.json()["step_id"], "succeeded")
    assert kept.get(run_id) is not None
    return run_id, first.json()["step_id"]


async def elsewhere(orch: Orchestrator, run_id: str, **values: Any) -> None:
    """The run changed by another process (this one's kept copy does not see it)."""
    async with orch.db.write() as session:
        await session.execute(sa.update(Run).where(Run.run_id == run_id).values(**values))


async def granted(orch: Orchestrator, r: httpx.Response) -> tuple[int | None, bool]:
    """The submitted step's grant of output tokens, and whether the budget clamped it."""
    assert r.status_code == 202, r.text
    async with orch.db.read() as session:
        step = await session.get(Step, r.json()["step_id"])
    assert step is not None
    return step.max_tokens_granted, step.budget_clamped


async def step_ids(client: httpx.AsyncClient, run_id: str) -> list[str]:
    return [s["step_id"] for s in (await client.get(f"/v1/runs/{run_id}/steps")).json()]


async def test_a_run_ended_elsewhere_takes_no_step(
    orch: Orchestrator, client: httpx.AsyncClient, kept: KeptRuns
) -> None:
    run_id, first = await kept_run(client, kept)
    await elsewhere(orch, run_id, status="cancelled")
    free = orch.pools.pools["local"].free_slots
    r = await submit(client, run_id, token="late", max_tokens=2)
    assert r.status_code == 409 and r.json()["code"] == "RUN_ENDED", r.text
    assert await step_ids(client, run_id) == [first]
    assert orch.pools.pools["local"].free_slots == free  # the slot it took went back
    assert kept.get(run_id) is None  # read again: it is let go


async def test_a_budget_spent_elsewhere_is_granted_as_a_read_would(
    orch: Orchestrator, client: httpx.AsyncClient, kept: KeptRuns
) -> None:
    """The kept ledger says 8 tokens are left; another process spent 6 of them: the step
    is clamped to the 2 really left, not granted the 4 it asks for."""
    run_id, _ = await kept_run(client, kept, budgets={"max_tokens_out": 10})
    await elsewhere(orch, run_id, tokens_out_used=8)
    r = await submit(client, run_id, token="next", max_tokens=4)
    assert await granted(orch, r) == (2, True)
    assert r.headers["X-Budget-Tokens-Remaining"] == "0"


async def test_a_budget_freed_elsewhere_is_granted_as_a_read_would(
    orch: Orchestrator, client: httpx.AsyncClient, kept: KeptRuns
) -> None:
    """The kept ledger (2 tokens held when it was last seen) would clamp a step asking for
    9 of the 10 to 8; the run holds nothing now, and another process gave back what it
    used: the step is granted all 9, unclamped."""
    run_id, _ = await kept_run(client, kept, budgets={"max_tokens_out": 10})
    await elsewhere(orch, run_id, tokens_out_used=0)
    r = await submit(client, run_id, token="next", max_tokens=9)
    assert await granted(orch, r) == (9, False)


class _Down(PerturbedAdapter):
    async def health(self) -> Health:
        return Health(live=False, ready=False, detail="restarting")


async def test_a_repeat_answers_with_its_step_where_a_new_one_is_refused(
    orch: Orchestrator, client: httpx.AsyncClient, kept: KeptRuns
) -> None:
    """A repeated request is answered with its first step, whatever a new one would meet
    (the kept attempt's refusal is not the answer): its budget spent, its pool down."""
    run_id, first = await kept_run(client, kept, budgets={"max_tokens_out": 2})
    again = await submit(client, run_id, token="first", max_tokens=2)
    assert again.status_code == 200 and again.json()["step_id"] == first, again.text
    new = await submit(client, run_id, token="new", max_tokens=2)
    assert new.status_code == 409 and new.json()["code"] == "BUDGET_EXCEEDED", new.text
    replica = orch.pools.pools["local"].replicas[0]
    engine, replica.adapter = replica.adapter, _Down(replica.adapter)
    try:
        await orch.pools.refresh()
        down = await submit(client, run_id, token="down", max_tokens=2)
        assert down.status_code == 503 and down.json()["code"] == "POOL_UNAVAILABLE", down.text
        again = await submit(client, run_id, token="first", max_tokens=2)
        assert again.status_code == 200 and again.json()["step_id"] == first, again.text
    finally:
        replica.adapter = engine
        await orch.pools.refresh()


async def test_each_policy_decision_is_counted_once(
    orch: Orchestrator, client: httpx.AsyncClient, kept: KeptRuns
) -> None:
    run_id, _ = await kept_run(client, kept)
    decisions = orch.metrics.policy
    allowed, denied = decisions.labels("allowed"), decisions.labels("denied")
    before = allowed._value.get(), denied._value.get()
    r = await submit(client, run_id, token="second", max_tokens=2)
    assert r.status_code == 202, r.text
    large = await submit(client, run_id, token="large", max_tokens=2, prompt="x" * 2_000_000)
    assert large.status_code == 413, large.text  # the kept attempt refused it, then the read
    assert (allowed._value.get(), denied._value.get()) == (before[0] + 2, before[1])
    denying = await make_run(
        client, policy={"rules": [{"id": "no", "effect": "deny", "match": {}}]}
    )
    for token in ("a", "b"):  # the second from the kept run: refused, read, refused again
        r = await submit(client, denying, token=token, max_tokens=2)
        assert r.status_code == 403, r.text
    assert kept.get(denying) is not None
    assert denied._value.get() == before[1] + 2


def test_kept_runs_are_running_record_runs_least_recently_used_let_go() -> None:
    runs = KeptRuns(size=2)
    running = {"mode": "record", "status": "running"}
    runs.keep("a", dict(running))
    runs.keep("b", dict(running))
    assert runs.get("a") is not None  # now the most recently used
    runs.keep("c", dict(running))
    assert (runs.get("a"), runs.get("b"), len(runs)) == (running, None, 2)
    runs.keep("a", {"mode": "record", "status": "cancelled"})
    runs.keep("r", {"mode": "replay", "status": "running"})
    assert (runs.get("a"), runs.get("r"), len(runs)) == (None, None, 1)
    none = KeptRuns(size=0)
    none.keep("a", dict(running))
    assert len(none) == 0
    with pytest.raises(ValueError, match="size"):
        KeptRuns(size=-1)


async def test_a_cost_budget_at_its_boundary_is_granted_as_a_read_would(
    db_url: str, tmp_path: Path
) -> None:
    """Costs are planned to 1e-9: where what is left is within that of the step's cost, the
    plan clamps the step by a token a fit check without margin would have granted it; the
    kept run's statement leaves such a step to a fresh read."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite reads the run in-process: no run is kept")
    from orchestratord.api.app import create_app
    from tests.conftest import make_settings

    (tmp_path / "2026-01-01.yaml").write_text(
        'version: "2026-01-01"\nunpriced: refuse\nentries:\n'
        "  - {engine: sim, model: sim-1, input_per_million_usd: 0.0,"
        " output_per_million_usd: 0.12345}\n"
    )
    orch = Orchestrator(make_settings(db_url, price_tables_dir=tmp_path))
    await orch.start()
    transport = httpx.ASGITransport(app=create_app(orchestrator=orch))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            run_id, _ = await kept_run(
                client, orch.submit_context.runs, budgets={"max_cost_usd": 5.0}
            )
            await elsewhere(orch, run_id, cost_used_usd=5.0 - 0.000123573)
            # 1001 tokens cost 0.000123573 (rounded from 0.00012357345): a fresh plan grants 1000
            r = await submit(client, run_id, token="edge", max_tokens=1001)
            assert await granted(orch, r) == (1000, True)
    finally:
        await orch.stop()


class _ThenEnded:
    """The run's read, after which another process cancels the run (before the statement
    that stores the step)."""

    def __init__(self, orch: Orchestrator, real: Any) -> None:
        self.orch, self.real = orch, real

    async def first(self, target: Any, params: Any) -> Any:
        row = await self.real.first(target, params)
        await elsewhere(self.orch, params["run_id"], status="cancelled")
        return row


async def test_a_run_ended_after_its_read_takes_no_step(
    orch: Orchestrator, client: httpx.AsyncClient, kept: KeptRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement that stores the step finds the run no longer running: refused as a read
    would have refused it, nothing stored, the slot given back (not stored by the general
    way, which does not check the run's status)."""
    from orchestratord.steps.submission import rules, statements

    run_id, first = await kept_run(client, kept)
    kept.drop(run_id)  # read, this time
    monkeypatch.setattr(rules, "RUN_AND_TOKEN", _ThenEnded(orch, statements.RUN_AND_TOKEN))
    free = orch.pools.pools["local"].free_slots
    r = await submit(client, run_id, token="late", max_tokens=2)
    assert r.status_code == 409 and r.json()["code"] == "RUN_ENDED", r.text
    assert await step_ids(client, run_id) == [first]
    assert orch.pools.pools["local"].free_slots == free
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 1 and run["reserved"]["tokens_out"] == 0


async def test_a_token_used_after_the_read_answers_with_its_step(
    orch: Orchestrator, client: httpx.AsyncClient, kept: KeptRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry of the same request commits its step between this one's read and its
    statement: the statement sees the token's step and this one answers with it, without
    reserving and giving back (the general way's insert ON CONFLICT)."""
    from orchestratord.steps import submission
    from orchestratord.steps.submission import rules, statements

    run_id, _ = await kept_run(client, kept)
    kept.drop(run_id)
    real = statements.RUN_AND_TOKEN
    raced: list[httpx.Response] = []
    reads: list[str] = []

    class _ThenRetried:
        async def first(self, target: Any, params: Any) -> Any:
            row = await real.first(target, params)
            reads.append(params["token"])
            if len(reads) == 1:  # the retry, read and stored in full meanwhile
                raced.append(await submit(client, run_id, token="retry", max_tokens=2))
            return row

    general: list[str] = []
    real_general = submission.Insert._reserve_and_insert

    async def spied(self: Any, sub: Any, **kw: Any) -> Any:
        general.append(sub.run_id)
        return await real_general(self, sub, **kw)

    monkeypatch.setattr(rules, "RUN_AND_TOKEN", _ThenRetried())
    monkeypatch.setattr(submission.Insert, "_reserve_and_insert", spied)
    r = await submit(client, run_id, token="retry", max_tokens=2)
    assert raced[0].status_code == 202, raced[0].text
    assert r.status_code == 200 and r.json()["step_id"] == raced[0].json()["step_id"], r.text
    assert general == []
    await wait_status(client, r.json()["step_id"], "succeeded")
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 2 and run["reserved"]["tokens_out"] == 0


async def test_a_run_ended_after_its_read_takes_no_queued_step(
    orch: Orchestrator, client: httpx.AsyncClient, kept: KeptRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race on the general way (a step that waits in its pool's queue): its
    reservation finds the run no longer running, and the step is refused, not queued."""
    import dataclasses

    from orchestratord.steps.submission import rules, statements

    run_id, first = await kept_run(client, kept)
    kept.drop(run_id)
    monkeypatch.setattr(
        orch, "submit_context", dataclasses.replace(orch.submit_context, starter=None)
    )
    monkeypatch.setattr(rules, "RUN_AND_TOKEN", _ThenEnded(orch, statements.RUN_AND_TOKEN))
    r = await submit(client, run_id, token="late", max_tokens=2)
    assert r.status_code == 409 and r.json()["code"] == "RUN_ENDED", r.text
    assert await step_ids(client, run_id) == [first]
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["step_count"] == 1 and run["reserved"]["tokens_out"] == 0
