"""A running step's end is one guarded statement (with its run's settlement, on
PostgreSQL): a step that is no longer running (ended elsewhere: cancelled, reaped) cannot be
ended again, and its run's account is untouched."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, cast

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from contracts.events import EndEvent, NarrationEvent
from orchestrator_core import clock
from orchestrator_core.errors import Conflict, NotFound
from orchestrator_core.lifecycle import StepStatus
from orchestratord.db.models import Run, Step
from orchestratord.eventlog import LogEvent, log_event
from orchestratord.runtime import Orchestrator
from orchestratord.steps.ending import Ending, StepEnd
from orchestratord.steps.ends import ending_finalizer
from orchestratord.tx import Tx
from tests.helpers import make_run, stored_events, submit, trace_asyncpg, wait_status


@asynccontextmanager
async def _transaction(orch: Orchestrator, on: str) -> AsyncIterator[Tx]:
    """The finalizer's transaction: a session's, or (SQLite) the driver's alone."""
    if on == "session":
        async with orch.db.write() as session:
            yield Tx(session)
        return
    if not orch.db.on_driver:
        pytest.skip("PostgreSQL ends steps in sessions")
    async with orch.db.driver_write() as tx:
        yield tx


def _ending() -> Ending:
    event = EndEvent(stop_reason="length", tokens_in=1, tokens_out=1, provenance=None)
    return Ending(StepStatus.SUCCEEDED, {"text": "x"}, tokens_in=1, tokens_out=1, event=event)


@pytest.mark.parametrize("on", ["session", "driver"])
async def test_an_ended_step_is_not_ended_again(
    orch: Orchestrator, client: httpx.AsyncClient, on: str
) -> None:
    run_id = await make_run(client)
    step_id = (await submit(client, run_id, max_tokens=2)).json()["step_id"]
    before = await wait_status(client, step_id, "succeeded")
    run_before = (await client.get(f"/v1/runs/{run_id}")).json()
    with pytest.raises(Conflict, match="succeeded, not running"):
        async with _transaction(orch, on) as target:
            await ending_finalizer(step_id, run_id, _ending()).run(target)
    assert (await client.get(f"/v1/steps/{step_id}")).json() == before
    assert (await client.get(f"/v1/runs/{run_id}")).json()["usage"] == run_before["usage"]


@pytest.mark.parametrize("on", ["session", "driver"])
async def test_ending_a_step_that_does_not_exist_names_it(orch: Orchestrator, on: str) -> None:
    with pytest.raises(NotFound):
        async with _transaction(orch, on) as target:
            await ending_finalizer("step_nope", "run_nope", _ending()).run(target)


async def test_a_step_ends_and_settles_in_one_statement_on_postgresql(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its row and its run's account, one round trip (two on SQLite, in-process)."""
    if orch.db.is_sqlite:
        pytest.skip("SQLite runs no UPDATE in a WITH: two statements, no round trip")

    run_id = await make_run(client)
    step_id = (await submit(client, run_id, max_tokens=2)).json()["step_id"]
    await wait_status(client, step_id, "succeeded")
    usage = (await client.get(f"/v1/runs/{run_id}")).json()["usage"]
    async with orch.db.write() as session:  # running again, holding 3 output tokens
        await session.execute(
            sa.update(Step)
            .where(Step.step_id == step_id)
            .values(status="running", tokens_out_reserved=3)
        )
        await session.execute(
            sa.update(Run).where(Run.run_id == run_id).values(tokens_out_reserved=3)
        )
    sql = trace_asyncpg(monkeypatch)
    async with orch.db.driver_write() as target:
        assert await ending_finalizer(step_id, run_id, _ending()).run(target) == []
    assert [head for head, _ in sql] == ["WITH ended AS"], sql
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["tokens_out"] == usage["tokens_out"] + 1
    assert run["reserved"]["tokens_out"] == 0
    assert (await client.get(f"/v1/steps/{step_id}")).json()["status"] == "succeeded"


async def _running_again(orch: Orchestrator, step_ids: list[str], held_out: int) -> None:
    """Ended steps made running again, each holding ``held_out`` output tokens of its run."""
    async with orch.db.write() as session:
        for step_id in step_ids:
            run_id = (
                await session.execute(
                    sa.update(Step)
                    .where(Step.step_id == step_id)
                    .values(
                        status="running",
                        tokens_out_reserved=held_out,
                        lease_owner="elsewhere",
                        lease_expires_at=clock.now() + timedelta(hours=1),
                    )
                    .returning(Step.run_id)
                )
            ).scalar_one()
            await session.execute(
                sa.update(Run)
                .where(Run.run_id == run_id)
                .values(tokens_out_reserved=Run.tokens_out_reserved + held_out)
            )


def _endings(n: int) -> list[Ending]:
    """Endings that differ in everything their rows keep: priced or not, an error, a
    provenance, a replay outcome."""
    endings = []
    for i in range(n):
        event = EndEvent(stop_reason="length", tokens_in=i, tokens_out=i + 1, provenance=None)
        endings.append(
            Ending(
                StepStatus.SUCCEEDED if i % 2 == 0 else StepStatus.FAILED,
                {"text": f"out {i}", "token_ids": [i, 7]},
                event=event,
                tokens_in=i,
                tokens_out=i + 1,
                cost_usd=None if i % 2 else 0.25 * (i + 1),
                provenance={"engine": "x", "n": i} if i % 2 == 0 else None,
                error={"code": "E", "n": i} if i % 2 else None,
                replay_outcome="diverged" if i == 1 else None,
            )
        )
    return endings


async def _state(client: httpx.AsyncClient, step_ids: list[str], run_ids: list[str]) -> object:
    """What the steps' and runs' views show, but their ids and times, and the load their
    placement saw (the free slots of when each was submitted)."""
    steps = [(await client.get(f"/v1/steps/{s}")).json() for s in step_ids]
    for step in steps:
        for key in ("step_id", "run_id", "client_token", "ended_at", "started_at", "created_at"):
            step.pop(key, None)
        for candidate in step["placement_decision"]["candidates"]:
            candidate.pop("free_slots")
    runs = [(await client.get(f"/v1/runs/{r}")).json() for r in run_ids]
    return steps, [(r["usage"], r["reserved"]) for r in runs]


_TWO_IN_TWO_RUNS = [0, 1, 0, 2, 1]  # five steps in three runs, two of them with two each
_ONE_PER_RUN = [0, 1, 2]


async def _steps(
    client: httpx.AsyncClient, pattern: list[int]
) -> tuple[list[str], list[str], list[str]]:
    """Runs, and a succeeded step in run ``pattern[i]`` for each i: (runs, each step's run,
    steps)."""
    runs = [await make_run(client) for _ in range(max(pattern) + 1)]
    order = [runs[i] for i in pattern]
    steps = [
        (await submit(client, r, f"t{i}", max_tokens=2)).json()["step_id"]
        for i, r in enumerate(order)
    ]
    for step_id in steps:
        await wait_status(client, step_id, "succeeded")
    return runs, order, steps


_Set = tuple[list[str], list[str], list[str]]


async def _two_sets_first_ended(
    orch: Orchestrator, client: httpx.AsyncClient, pattern: list[int]
) -> tuple[_Set, _Set, list[Ending]]:
    """Two like sets of steps (``_steps``) running again, the first ended one step at a
    time the single-step way; (the first, the second, their endings)."""
    first, second = await _steps(client, pattern), await _steps(client, pattern)
    await _running_again(orch, first[2] + second[2], 3)
    endings = _endings(len(pattern))
    for step_id, run_id, ending in zip(first[2], first[1], endings, strict=True):
        async with orch.db.write() as session:
            await ending_finalizer(step_id, run_id, ending).run(Tx(session))
    return first, second, endings


async def test_steps_ending_in_one_commit_end_as_each_alone_would(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five steps in three runs ending together leave their rows and their runs' accounts
    as the same ends made one by one; on PostgreSQL in one statement for each step of a
    run (here two), not one per step."""

    sets = await _two_sets_first_ended(orch, client, _TWO_IN_TWO_RUNS)
    (runs_a, _, alone), (runs_b, order_b, together), endings = sets

    sql = trace_asyncpg(monkeypatch)
    finalizers = [
        ending_finalizer(s, r, e) for s, r, e in zip(together, order_b, endings, strict=True)
    ]
    end_all = finalizers[0].together
    assert end_all is not None and all(f.together is end_all for f in finalizers)
    async with orch.db.write() as session:
        assert await end_all(Tx(session), [f.item for f in finalizers]) == []
    if not orch.db.is_sqlite:
        assert [head for head, _ in sql] == ["WITH ended AS"] * 2, sql
    assert await _state(client, together, runs_b) == await _state(client, alone, runs_a)
    await _check_ended_rows(orch, together[2:], order_b[2:])  # each run's last end
    steps, accounts = cast(tuple[list[Any], list[Any]], await _state(client, together, runs_b))
    assert [s["status"] for s in steps] == ["succeeded", "failed"] * 2 + ["succeeded"]
    assert all(reserved["tokens_out"] == 0 for _, reserved in accounts)


async def test_a_step_not_running_among_steps_ending_together_is_named(
    orch: Orchestrator, client: httpx.AsyncClient
) -> None:
    """One step of several ended elsewhere: the commit fails naming it (the event log then
    commits each step apart, ``test_event_writer``), and nothing of the others is kept."""
    runs, order, steps = await _steps(client, _TWO_IN_TWO_RUNS)
    await _running_again(orch, [s for i, s in enumerate(steps) if i != 3], 3)
    before = await _state(client, steps, runs)
    finalizers = [
        ending_finalizer(s, r, e) for s, r, e in zip(steps, order, _endings(5), strict=True)
    ]
    end_all = finalizers[0].together
    assert end_all is not None
    with pytest.raises(Conflict, match=f"step {steps[3]} is succeeded, not running"):
        async with orch.db.write() as session:
            await end_all(Tx(session), [f.item for f in finalizers])
    assert await _state(client, steps, runs) == before


async def test_a_step_ended_elsewhere_fails_alone_among_steps_ending_together(
    orch: Orchestrator, client: httpx.AsyncClient
) -> None:
    """Steps ending in one commit of the event log, one of them ended elsewhere meanwhile
    (reaped, say): the others end and their events are written; its end and event are not,
    and its log takes no more."""
    runs, order, steps = await _steps(client, _TWO_IN_TWO_RUNS)
    await _running_again(orch, [s for i, s in enumerate(steps) if i != 3], 3)
    assert await _end_through_writer(orch, steps, order, _endings(5)) == [1, 1, 1, 0, 1]
    shown = [(await client.get(f"/v1/steps/{s}")).json()["status"] for s in steps]
    assert shown == ["succeeded", "failed", "succeeded", "succeeded", "succeeded"]
    assert orch.writer.failed_steps == {steps[3]}
    accounts = [(await client.get(f"/v1/runs/{r}")).json()["reserved"] for r in runs]
    assert [a["tokens_out"] for a in accounts] == [0, 0, 0]


async def _end_through_writer(
    orch: Orchestrator,
    steps: list[str],
    order: list[str],
    endings: list[Ending],
    also: list[LogEvent] = [],  # noqa: B006 (read only)
) -> list[int]:
    """The steps' terminal events and ends queued together (one commit of the event log),
    after the events ``also``; how many events each step's log took."""
    logged = {s: len(await stored_events(orch.db, step_id=s)) for s in steps}
    await orch.writer.append(also)
    for step_id, run_id, ending in zip(steps, order, endings, strict=True):
        event = log_event(run_id, step_id, logged[step_id], ending.event)
        await orch.writer.append([event], finalizer=ending_finalizer(step_id, run_id, ending))
    await orch.writer.wait_drained()
    return [len(await stored_events(orch.db, step_id=s)) - logged[s] for s in steps]


async def test_steps_ending_in_runs_taking_steps_end_in_the_statement_of_their_events(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: steps of distinct running runs that end in one commit of the event log
    end in the statement appending their terminal events, with no transaction around it;
    their rows and runs' accounts as each end alone leaves them."""
    if orch.db.is_sqlite:
        pytest.skip("SQLite's commits are in-process: no round trip to save")
    sets = await _two_sets_first_ended(orch, client, _ONE_PER_RUN)
    (runs_a, _, alone), (runs_b, order_b, together), endings = sets
    other = await make_run(client)  # events in the same statement, no step ending
    other_before = await _run_row(orch, other)
    statements = trace_asyncpg(monkeypatch, task="event-writer")
    narration = log_event(other, None, None, NarrationEvent(text="meanwhile"))
    assert await _end_through_writer(orch, together, order_b, endings, [narration]) == [1, 1, 1]
    assert statements == [("WITH locked AS", False)]
    assert await _state(client, together, runs_b) == await _state(client, alone, runs_a)
    await _check_ended_rows(orch, together, order_b)
    after = await _run_row(orch, other)
    assert after.pop("event_seq") == other_before.pop("event_seq") + 1
    assert after == other_before  # its account and update time as they were


async def _run_row(orch: Orchestrator, run_id: str) -> dict[str, Any]:
    async with orch.db.read() as session:
        row = (await session.execute(sa.select(Run).where(Run.run_id == run_id))).scalar_one()
        return {c.key: getattr(row, c.key) for c in Run.__table__.columns}


async def _check_ended_rows(orch: Orchestrator, steps: list[str], order: list[str]) -> None:
    """Each step's lease let go, and its end stamped as its run's update (on PostgreSQL in
    the one statement: at the same time; SQLite settles in a second one)."""
    for step_id, run_id in zip(steps, order, strict=True):
        async with orch.db.read() as session:
            step = await session.get(Step, step_id)
            assert step is not None
            assert (step.lease_owner, step.lease_expires_at) == (None, None)
            assert step.ended_at is not None
        updated = (await _run_row(orch, run_id))["updated_at"]
        assert step.ended_at == updated if not orch.db.is_sqlite else step.ended_at <= updated


async def test_ends_that_cannot_go_with_their_events_are_made_in_a_transaction(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: one of the steps was ended elsewhere: the statement with the events writes
    nothing, and the commit is made the general way (where its end conflicts, and the
    others commit apart from it)."""
    if orch.db.is_sqlite:
        pytest.skip("SQLite's commits are in-process: no round trip to save")
    runs, order, steps = await _steps(client, _ONE_PER_RUN)
    await _running_again(orch, steps[:2], 3)  # the third is not running
    statements = trace_asyncpg(monkeypatch, task="event-writer")
    assert await _end_through_writer(orch, steps, order, _endings(3)) == [1, 1, 0]
    assert statements[0] == ("WITH locked AS", False)  # refused: nothing written
    assert ("WITH locked AS", True) in statements[1:]  # the general way, in a transaction
    shown = [(await client.get(f"/v1/steps/{s}")).json()["status"] for s in steps]
    assert shown == ["succeeded", "failed", "succeeded"]
    assert orch.writer.failed_steps == {steps[2]}
    accounts = [(await client.get(f"/v1/runs/{r}")).json()["reserved"] for r in runs]
    assert [a["tokens_out"] for a in accounts] == [0, 0, 0]


async def test_the_last_step_of_a_cancelling_run_ends_it_in_the_batchs_transaction(
    orch: Orchestrator, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run no longer taking steps (cancelling): on PostgreSQL the one statement with the
    events refuses; the batch's transaction ends the step and, its last, the run
    (``cancelled``, ``run_end``)."""
    runs, order, steps = await _steps(client, [0])
    await _running_again(orch, steps, 3)
    async with orch.db.write() as session:
        await session.execute(
            sa.update(Run).where(Run.run_id == runs[0]).values(status="cancelling")
        )
    statements = trace_asyncpg(monkeypatch, task="event-writer")
    assert await _end_through_writer(orch, steps, order, _endings(1)) == [1]
    if not orch.db.is_sqlite:
        assert statements[0] == ("WITH locked AS", False)  # refused: nothing written
        assert ("WITH locked AS", True) in statements[1:]
    assert (await client.get(f"/v1/runs/{runs[0]}")).json()["status"] == "cancelled"
    assert (await stored_events(orch.db, run_id=runs[0]))[-1].type == "run_end"


def _set_columns(update: Any) -> set[str]:
    """The columns an UPDATE sets, read from its PostgreSQL text."""
    sql = str(update.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
    sets = re.split(r" FROM | WHERE ", sql.split(" SET ", 1)[1], maxsplit=1)[0]
    return {part.split("=", 1)[0].strip() for part in re.split(r",\s*(?=\w+=)", sets)}


def test_every_statement_ending_steps_sets_the_columns_of_step_end() -> None:
    """One definition: each shape (one step, several in one statement, several beside their
    terminal events) sets each field of ``StepEnd`` and what the lifecycle's end implies."""
    from orchestratord.steps import ends

    fields = {f.name for f in dataclasses.fields(StepEnd)}
    assert fields <= set(Step.__table__.columns.keys())
    implied = {"ended_at", "lease_owner", "lease_expires_at"}
    shapes = [ends._ENDS_RUNNING, ends._ENDED_MANY.element, ends._ALONGSIDE_ENDED.element]
    for shape in shapes:
        assert _set_columns(shape) == fields | implied
