"""Submitting a step: small rules applied in order to one ``Submission``.

Each rule reads what the rules before it resolved and either goes on (returns ``None``),
answers (returns ``Submitted``: a repeated request, a replay step served from its record),
or refuses by raising a domain error that the HTTP layer maps (422, 403, 409, 429, 503...).
The rules never ask which kind of step they hold: they call the kind's protocol
(``steps/kinds``). In order:

    LoadRun -> ResolveKind -> Place -> Police -> BoundPrompt -> MatchRecord -> Quote -> StartNow
    -> Admit -> Insert

On PostgreSQL a run the process has read before is taken as it kept it (``runs/kept.py``),
with no read: its settings never change, and what does (its status, its budget, whether the
client_token was used) is checked by the one statement that stores the step. Anything that
statement or a rule finds only a fresh read can decide (a refusal, the token taken, a run
near its budget, a step that must wait) starts the submission again from a read
(``ReadAgain``): only a step stored from the kept run answers from it.

In a replay run ``Place`` takes the run's row lock and matches the recorded step at the
step's position; ``MatchRecord`` serves a step no engine runs again from the record (or
ends it with ``REPLAY_MISS``) without price or admission. In a record run an engine step
whose pool has a free slot, with nothing queued ahead of it there, takes the slot and is
inserted running (``StartNow``): its execution begins once the submission commits, with no
claim of its own; it never waits, so admission (which bounds the queue) does not count it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import placement_to_json
from contracts.steps import AnyStepCreate
from orchestrator_core import budgets, clock
from orchestrator_core.admission import PRIORITY_RANK, AdmissionPolicy, admit, dropped_error
from orchestrator_core.budgets import BudgetExceeded, Ledger, Limits, Reservation
from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import (
    Conflict,
    NotFound,
    OrchestratorError,
    PoolUnavailable,
    TooLarge,
)
from orchestrator_core.generation import LlmInput
from orchestrator_core.lifecycle import RunStatus, StepStatus, check_run_accepts_steps
from orchestrator_core.placement import choose_pool
from orchestrator_core.policy import Decision, PolicyDenied, PolicySubject, redact_json
from orchestrator_core.pricing import Price
from orchestratord import tracing
from orchestratord.db.models import Flow, Run, Step
from orchestratord.db.prepared import (
    Prepared,
    Target,
    can_run_alone,
    detached,
    nothing_written,
    transient,
)
from orchestratord.metrics import Metrics
from orchestratord.policies import policy_of
from orchestratord.pools.registry import Pool, PoolRegistry, Replica
from orchestratord.prices import PriceBook
from orchestratord.replay.steps import ReplayTarget, lock_run, replay_target, serve_recorded
from orchestratord.runs.kept import KeptRuns
from orchestratord.runs.ledger import (
    COST_MARGIN,
    RESERVE,
    read_account,
    read_ledger,
    reserve,
    reserve_params,
    reserved,
    unreserve,
)
from orchestratord.steps.kinds import KINDS, kind_of
from orchestratord.steps.kinds.base import StepKind
from orchestratord.steps.queries import by_token, ledger_of, same_request
from orchestratord.steps.running import ClaimedStep
from orchestratord.steps.transition import end_unstarted
from orchestratord.tx import Tx

policy_log = logging.getLogger("orchestratord.policy")


class Starter(Protocol):
    """Starts an engine step in its submission's transaction (the dispatcher)."""

    def may_start(self) -> bool:
        """Steps may start (the process is not draining)."""
        ...

    def slot_for(self, pool: Pool, run: Run) -> Replica | None:
        """A slot taken for a step of ``run`` on ``pool`` (its session's replica where the
        engine keeps sessions), or None; given back with ``give_back``."""
        ...

    def give_back(self, pool: Pool, replica: Replica) -> None:
        """A slot taken by a submission that stored no started step: free again, for a
        step queued meanwhile too."""
        ...

    def claim(self, step: Step, replica: Replica) -> None:
        """The step runs on ``replica``: running, leased (in the caller's transaction)."""
        ...

    def begin(self, claimed: ClaimedStep) -> None:
        """Its claim committed: execute it."""
        ...


@dataclass(frozen=True)
class SubmitContext:
    """What submission needs from the running service."""

    pools: PoolRegistry
    prices: PriceBook
    admission: AdmissionPolicy
    default_cancel_on_disconnect: bool
    metrics: Metrics = field(default_factory=Metrics)
    max_prompt_chars: int = 1_000_000
    starter: Starter | None = None  # None: every step waits for the dispatcher
    runs: KeptRuns = field(default_factory=KeptRuns)  # PostgreSQL: runs read before


@dataclass(frozen=True)
class Submitted:
    step: Step
    created: bool
    ledger: Ledger  # the run's account after this submission
    run: Run  # as the submission read it (its budgets and creation time do not change)


@dataclass
class Submission:
    """One submission as the rules resolve it."""

    tx: Tx
    ctx: SubmitContext
    run_id: str
    body: AnyStepCreate
    request_hash: str = ""
    run: Run = field(init=False)
    kind: StepKind = field(init=False)
    stored: dict[str, Any] = field(default_factory=dict)
    placement: Any = None
    pool_id: str | None = None
    target: ReplayTarget | None = None
    decision: Decision = field(init=False)
    llm: LlmInput | None = None
    price: Price | None = None
    tokens_in: int = 0
    verdict: str = "admit"
    slot: Slot | None = None  # StartNow: the free slot the step took
    queue_unchecked: bool = False  # StartNow left the pool's queue to Insert's statement
    announce: Callable[[Step], None] | None = None  # see ``submit_step``
    kept: dict[str, Any] | None = None  # the run as kept, not read (see the module's docstring)
    subject: PolicySubject | None = None  # a kept run's: its decision is not yet recorded

    @property
    def session(self) -> AsyncSession:
        return self.tx.session

    @property
    def db(self) -> Target:
        """Where its prepared statements run (no session is made for them alone)."""
        return self.tx.target

    @property
    def sqlite(self) -> bool:
        return self.tx.sqlite

    def repeat(self, step: Step) -> Submitted:
        return Submitted(
            same_request(step, self.request_hash), False, ledger_of(self.run), self.run
        )


class Rule(Protocol):
    async def apply(self, sub: Submission) -> Submitted | None: ...


class ReadAgain(Exception):
    """A submission from a kept run met what only a fresh read of the run decides."""


# the run and the step its client_token already made, if one: one statement (a repeated
# request is rare; its step is loaded only then)
_RUN_COLUMNS = tuple(c.key for c in cast(sa.Table, Run.__table__).columns)
_RUN_AND_TOKEN = Prepared(
    sa.select(*cast(sa.Table, Run.__table__).columns, Step.step_id)
    .outerjoin(
        Step,
        sa.and_(Step.run_id == Run.run_id, Step.client_token == sa.bindparam("token")),
    )
    .where(Run.run_id == sa.bindparam("run_id"))
)


class LoadRun:
    """The run exists; a repeated ``client_token`` answers with the first step; the run
    still takes steps. A kept run is not read: ``Insert``'s one statement checks all three."""

    async def apply(self, sub: Submission) -> Submitted | None:
        body = sub.body
        sub.request_hash = sha256_of(
            {
                **body.model_dump(mode="json", exclude={"client_token", "input"}),
                "input": body.input.model_dump(mode="json", exclude_unset=True),
            }
        )
        if sub.kept is not None:  # a running record run: the statement storing the step checks
            sub.run = detached(Run, sub.kept)
            return None
        params = {"run_id": sub.run_id, "token": body.client_token}
        found = await _RUN_AND_TOKEN.first(sub.db, params)
        if found is None:
            sub.ctx.runs.drop(sub.run_id)
            raise NotFound("run", sub.run_id)
        values = dict(zip(_RUN_COLUMNS, found, strict=False))
        sub.run = detached(Run, values)
        if not sub.sqlite:  # where a read is a round trip
            sub.ctx.runs.keep(sub.run_id, values)
        repeated = found[-1]
        if repeated is not None:
            existing = await by_token(sub.session, sub.run_id, body.client_token)
            assert existing is not None  # steps are never deleted
            return sub.repeat(existing)
        check_run_accepts_steps(RunStatus(sub.run.status))
        return None


class ResolveKind:
    """The kind that serves the type (501 when none does), and the input it stores."""

    async def apply(self, sub: Submission) -> Submitted | None:
        sub.kind = kind = kind_of(sub.body.type)
        assert isinstance(sub.body.input, kind.input_model)  # the union and the registry agree
        flow = await sub.session.get(Flow, sub.run.flow_id) if kind.uses_flow else None
        assert flow is not None or not kind.uses_flow  # runs reference their flow
        sub.stored = kind.normalize(sub.body.input, flow=flow, field="input")
        sub.placement = placement_to_json(sub.body.placement)
        return None


class Place:
    """Record runs: engine kinds go to a pool (placement, else the run's pool policy).
    Replay runs: the step takes the next position under the run's lock, matched with the
    recorded step there; it goes where that step ran."""

    async def apply(self, sub: Submission) -> Submitted | None:
        with tracing.span("step.place", run_id=sub.run_id, kind=sub.body.type) as span:
            answer = await self._place(sub)
            tracing.annotate(span, pool=sub.pool_id)
        return answer

    async def _place(self, sub: Submission) -> Submitted | None:
        run = sub.run
        if run.mode == "record":
            if sub.kind.engine:
                effective = sub.placement if sub.placement is not None else run.pool_policy
                sub.pool_id = choose_pool(
                    effective,
                    sub.ctx.pools.views(),
                    field="placement" if sub.placement else "pool_policy",
                )
            return None
        if run.mode == "strict_replay" and not sub.sqlite:
            # it may go through admission: take that lock first, as record submissions do
            await admission_lock(sub.session, sub.body.priority)
        sub.run = run = await lock_run(sub.session, sub.run_id)
        existing = await by_token(sub.session, sub.run_id, sub.body.client_token)
        if existing is not None:  # raced the lock
            return sub.repeat(existing)
        check_run_accepts_steps(RunStatus(run.status))  # it may have been cancelled meanwhile
        sub.target = await replay_target(sub.session, run)
        sub.pool_id = sub.target.pool_id
        return None


class Police:
    """The run's policy decides (403 naming the rule); redact rules mask the stored input."""

    async def apply(self, sub: Submission) -> Submitted | None:
        pool = sub.ctx.pools.get(sub.pool_id) if sub.pool_id is not None else None
        target = sub.target
        model = sub.stored.get("model") or (
            pool.model_name if pool is not None else target.model if target is not None else None
        )
        subject = sub.kind.subject(sub.stored, model=model, pool=sub.pool_id)
        sub.decision = decision = policy_of(sub.run).evaluate(subject)
        if sub.kept is None:
            record_decision(sub.ctx.metrics, sub.run_id, subject, decision)
        else:  # recorded once, by the attempt that answers (a kept run's may read again)
            sub.subject = subject
        if not decision.allowed:
            raise PolicyDenied(decision.rule_id or "", subject)
        if decision.patterns:
            sub.stored = redact_json(sub.stored, sub.decision.patterns)
        sub.llm = sub.kind.llm_input(sub.stored)
        return None


class BoundPrompt:
    """A prompt (or the messages together) is at most ``limits.max_prompt_chars`` long."""

    async def apply(self, sub: Submission) -> Submitted | None:
        llm, limit = sub.llm, sub.ctx.max_prompt_chars
        if llm is None:
            return None
        if llm.messages is not None:
            size, field_name = sum(len(m.content) for m in llm.messages), "input.messages"
        else:
            size, field_name = len(llm.prompt or ""), "input.prompt"
        if size > limit:
            raise TooLarge(
                f"a prompt is at most {limit} characters, not {size}",
                limit="limits.max_prompt_chars",
                value=limit,
                field=field_name,
            )
        return None


class MatchRecord:
    """Replay runs: a step no engine runs again is served from the record, or ends with
    ``REPLAY_MISS`` naming every input that differs."""

    async def apply(self, sub: Submission) -> Submitted | None:
        target = sub.target
        if target is None:
            return None
        recorded = target.recorded
        recorded_key = (
            None
            if recorded is None
            else kind_of(recorded.type).replay_key(
                recorded.input, int((recorded.provenance or {}).get("seed", target.source_seed))
            )
        )
        target.compare(sub.kind.replay_key(sub.stored, sub.run.seed), recorded_key)
        if target.executes(sub.run.mode, sub.ctx.pools, engine=sub.kind.engine):
            return None
        return await _submit_unexecuted(sub, target)


class Quote:
    """Engine kinds: the price of the model on its pool (the pool's own, else the run's price
    table; a model with neither runs unpriced, and is refused under a cost budget), and the
    prompt's tokens by the engine's tokenizer. A strict_replay step needs its recorded replica
    ready."""

    async def apply(self, sub: Submission) -> Submitted | None:
        if not sub.kind.engine:
            return None
        assert sub.pool_id is not None and sub.llm is not None
        pool = sub.ctx.pools.require(sub.pool_id)
        if sub.target is not None:
            _require_ready_replica(pool, sub.target)
        model = sub.stored.get("model") or pool.model_name
        table = sub.run.price_table
        sub.price = sub.ctx.prices.resolve(table, engine=pool.engine, model=model, own=pool.price)
        step_budgets = sub.body.budgets.model_dump() if sub.body.budgets else None
        budgets.require_price(
            sub.price,
            run=Limits.from_dict(sub.run.budgets),
            step=Limits.from_dict(step_budgets),
            engine=pool.engine,
            model=model,
            price_table=table,
        )
        sub.tokens_in = pool.count_prompt_tokens(sub.llm)
        return None


def _queued(**where: str) -> list[Any]:
    """Queued steps whose ``column`` equals the parameter ``param``, for each given."""
    clauses: list[Any] = [Step.status == StepStatus.QUEUED.value]
    return clauses + [getattr(Step, col) == sa.bindparam(param) for col, param in where.items()]


# a step of this priority or higher waits in the pool
_AHEAD_IN_POOL = Prepared(
    sa.select(
        sa.exists().where(*_queued(pool_id="pool_id"), Step.priority_rank <= sa.bindparam("rank"))
    )
)
_QUEUED_AT_PRIORITY = Prepared(
    sa.select(sa.func.count()).select_from(Step).where(*_queued(priority="priority"))
)


@dataclass
class Slot:
    """A slot ``StartNow`` took; given back once, whichever way the submission fails."""

    starter: Starter
    pool: Pool
    replica: Replica
    held: bool = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.starter.give_back(self.pool, self.replica)


class StartNow:
    """Record runs: an engine step starts in its submission's transaction when its pool has a
    free slot (its session's replica's, where the engine keeps sessions) and no step of its
    priority or higher waits in that pool's queue (the queue's order holds). It takes the
    slot here; the slot goes back if the submission does not commit. Where the step will be
    stored by one statement (``Insert``), that statement checks the queue instead: no round
    trip of its own."""

    async def apply(self, sub: Submission) -> Submitted | None:
        starter = sub.ctx.starter
        if starter is None or not sub.kind.engine or sub.target is not None:
            return None
        if sub.pool_id is None or not starter.may_start():
            return None
        pool = sub.ctx.pools.require(sub.pool_id)
        if pool.free_slots <= 0:
            return None
        if _in_one_statement(sub):
            sub.queue_unchecked = True
        else:
            params = {"pool_id": pool.pool_id, "rank": PRIORITY_RANK[sub.body.priority]}
            if (await _AHEAD_IN_POOL.rows(sub.db, params))[0][0]:
                return None
        replica = starter.slot_for(pool, sub.run)  # taken meanwhile, or its session's is busy
        if replica is not None:
            sub.slot = slot = Slot(starter, pool, replica)
            sub.tx.on_rollback(slot.release)
        return None


class Admit:
    """Engine kinds wait in a bounded queue per priority (429, or drop the oldest). A step
    that took a free slot never waits: it is not counted, and takes no admission lock."""

    async def apply(self, sub: Submission) -> Submitted | None:
        if not sub.kind.engine or sub.slot is not None:
            return None
        if sub.kept is not None:  # the queue's lock begins a transaction: the run is read
            raise ReadAgain
        priority = sub.body.priority
        if not sub.sqlite:  # one admitter per priority at a time across processes
            await admission_lock(sub.session, priority)
        queued = (await _QUEUED_AT_PRIORITY.rows(sub.db, {"priority": priority}))[0][0]
        sub.verdict = admit(sub.ctx.admission, priority=priority, queued=queued)
        return None


_STEP_TABLE = cast(sa.Table, Step.__table__)
_RUNS = cast(sa.Table, Run.__table__)
_STEP_COLUMNS = tuple(c.key for c in _STEP_TABLE.columns)
_INSERT_STEP = Prepared(_STEP_TABLE.insert())
_INSERT_STEP_UNLESS_TOKEN = Prepared(
    pg_insert(_STEP_TABLE)
    .on_conflict_do_nothing(index_elements=["run_id", "client_token"])
    .returning(_STEP_TABLE.c.step_id)
)


# PostgreSQL: the pool's queue checked, the reservation and the insert in one statement,
# the step's position taken from the reserved run's row (no step when a step waits ahead or
# the reservation does not fit). Its one row: whether a step waits ahead, then RESERVE's
# columns (null when nothing was reserved). The step's values are its columns' names
# prefixed with ``s_``.
#
# whether a step of this priority or higher waits in the pool (none when ``q_pool`` is null)
_AHEAD = sa.select(
    sa.exists()
    .where(*_queued(pool_id="q_pool"), Step.priority_rank <= sa.bindparam("q_rank"))
    .label("ahead")
).cte("ahead")
# the reservation, unless a step waits ahead (``StartNow`` left the check to this statement),
# in a run that still takes steps and has no step of this client_token (a kept run's status
# and steps were not read; a token taken by a statement not yet committed still fails the
# insert)
_TOKEN_USED = sa.exists().where(
    _STEP_TABLE.c.run_id == sa.bindparam("b_run_id"),
    _STEP_TABLE.c.client_token == sa.bindparam("s_client_token"),
)
_RESERVED = RESERVE.where(~sa.select(_AHEAD.c.ahead).scalar_subquery(), ~_TOKEN_USED).cte(
    "reserved"
)
_INSERTED = (
    _STEP_TABLE.insert()
    .from_select(
        list(_STEP_TABLE.columns),
        sa.select(
            *(
                # asyncpg's dialect writes each parameter's type ($1::VARCHAR): no casts here (a
                # cast to VARCHAR(n) would cut a value the insert refuses)
                (_RESERVED.c.step_count - 1)
                if c.key == "position"
                else sa.bindparam(f"s_{c.key}", type_=c.type)
                for c in _STEP_TABLE.columns
            )
        ),
    )
    .cte("inserted")
)
# its row: whether a step waits ahead, RESERVE's columns, then (as of the statement's start,
# for when nothing was reserved) whether the token's step exists and the run's status
_RESERVE_AND_INSERT = Prepared(
    sa.select(
        _AHEAD.c.ahead,
        *_RESERVED.c,
        _TOKEN_USED.label("token_used"),
        sa.select(_RUNS.c.status)
        .where(_RUNS.c.run_id == sa.bindparam("b_run_id"))
        .scalar_subquery()
        .label("run_status"),
    )
    .select_from(_AHEAD.outerjoin(_RESERVED, sa.true()))
    .add_cte(_INSERTED)
)


def _in_one_statement(sub: Submission) -> bool:
    """The step will be stored by one statement that commits by itself (``Insert``)."""
    return not sub.sqlite and sub.target is None and can_run_alone(sub.db)


_WAITS = object()  # Insert._in_one_statement: a step waits ahead in the pool
_TAKEN = object()  # Insert._in_one_statement: the client_token's step exists


class _TokenTaken(Exception):
    """The step's client_token was taken by a submission that committed meanwhile."""


class Insert:
    """Reserve the worst case against the run in one conditional UPDATE (limits re-checked
    in the database, so concurrent submissions cannot overshoot), then insert the step.

    On PostgreSQL, when nothing has begun in the submission's transaction (its reads ran on
    their own: a record step that starts now, or a control step), both are one statement
    that commits by itself, with the pool-queue check ``StartNow`` left to it: no BEGIN, no
    COMMIT, four round trips fewer. A client_token taken meanwhile fails that statement
    whole (nothing reserved), and the step that took it answers; a step found waiting
    behind the queue, or a ledger spent since it was read, writes nothing and goes the
    general way below."""

    async def apply(self, sub: Submission) -> Submitted | None:
        if sub.sqlite:  # writes are serialized: the token check above cannot be raced
            step, ledger = await self._reserve_and_insert(sub)
            return Submitted(step, True, ledger, sub.run)
        if sub.verdict == "admit" and _in_one_statement(sub):
            try:
                done = await self._in_one_statement(sub)
            except IntegrityError as exc:
                if sub.kept is not None:  # its token was used (a repeat, most likely)
                    raise ReadAgain from exc
                return await self._taken(sub, exc)
            if isinstance(done, tuple):
                step, ledger = done
                return Submitted(step, True, ledger, sub.run)
            if sub.kept is not None:  # waits, a repeat, or does not fit: what a read decides
                raise ReadAgain
            if done is _TAKEN:  # committed by a submission of the token since the run's read
                return await self._taken(sub, None)
            if done is _WAITS:  # a step waits ahead in its pool: this one waits too, admitted
                assert sub.slot is not None
                sub.slot.release()
                sub.slot = None
                await _ADMIT.apply(sub)
            # else the budget did not fit the ledger the submission read: read it again, below
        if sub.kept is not None:  # no read, no status checked: stored by the one statement only
            raise ReadAgain
        assert not sub.queue_unchecked or sub.slot is None  # only one statement checks it
        try:
            if sub.verdict == "drop_oldest":  # a victim ended: undone with the savepoint
                async with sub.session.begin_nested():
                    step, ledger = await self._reserve_and_insert(sub)
            else:  # the insert gives way to the step that took the token (no savepoint)
                step, ledger = await self._reserve_and_insert(sub, on_conflict=True)
        except (IntegrityError, _TokenTaken) as exc:
            return await self._taken(sub, exc)
        return Submitted(step, True, ledger, sub.run)

    @staticmethod
    async def _taken(sub: Submission, exc: Exception | None) -> Submitted:
        """The client_token's step, made by a submission that committed meanwhile (else
        ``exc`` was about something else: raised again)."""
        existing = await by_token(sub.session, sub.run_id, sub.body.client_token)
        if existing is None:
            raise exc or AssertionError("the token's step was seen, then not found")
        if sub.slot is not None:  # the transaction goes on (and commits): give it back here
            sub.slot.release()
        return sub.repeat(existing)

    async def _in_one_statement(self, sub: Submission) -> tuple[Step, Ledger] | object | None:
        """Reserve and insert in one statement run alone, with the ledger the submission
        read; ``_WAITS`` when a step waits ahead of one that took a slot (``StartNow``),
        ``_TAKEN`` when the client_token's step exists, ``RunEnded`` when the run ended since
        it was read, None when the step does not fit the ledger (nothing written by any)."""
        limits = Limits.from_dict(sub.run.budgets)
        unchecked, sub.queue_unchecked = sub.queue_unchecked, False
        rank = PRIORITY_RANK[sub.body.priority]
        try:
            reservation = self._plan(sub, ledger_of(sub.run))
            if sub.kept is not None and reservation != self._plan(sub, Ledger()):
                raise ReadAgain  # the run's ledger shaped it: what it holds now decides
        except BudgetExceeded:  # read again below; the queue first, as StartNow would have
            if sub.kept is not None:
                raise ReadAgain from None
            ahead = {"pool_id": sub.pool_id, "rank": rank}
            if unchecked and (await _AHEAD_IN_POOL.rows(sub.db, ahead))[0][0]:
                return _WAITS
            return None
        step = build_step(sub, position=-1, reservation=reservation)
        started = self._claim(sub, step)
        held = step.__dict__
        # a kept run's fits only with room to spare for the plan's rounding: then the ledger,
        # whatever it holds now, gives this very reservation (unclamped, as in an empty
        # ledger); at the boundary a fresh read decides
        margin = COST_MARGIN if sub.kept is None else -2 * COST_MARGIN
        params = reserve_params(sub.run_id, limits, reservation, cost_margin=margin)
        params.update({f"s_{c}": held.get(c) for c in _STEP_COLUMNS})
        params.update(q_pool=sub.pool_id if unchecked else None, q_rank=rank)
        if sub.announce is not None:
            sub.announce(step)
        row = await _RESERVE_AND_INSERT.first(sub.db, params, alone=True)
        assert row is not None  # one row (see the statement)
        ahead, taken, token_used, status = row[0], row[1:8], row[8], row[9]
        if ahead or taken[0] is None:  # nothing reserved, nothing inserted
            nothing_written(sub.db)
            if ahead:
                return _WAITS
            if token_used:
                return _TAKEN
            if status != RunStatus.RUNNING.value:  # ended since it was read (or kept)
                sub.ctx.runs.drop(sub.run_id)
                if status is None:
                    raise NotFound("run", sub.run_id)
                check_run_accepts_steps(RunStatus(status))
            return None  # the budget did not fit (or the run ended as the statement ran)
        step.position, ledger = reserved(taken)
        sub.ctx.runs.saw_ledger(sub.run_id, ledger)
        self._begin_after_commit(sub, started)
        return step, ledger

    def _plan(self, sub: Submission, ledger: Ledger) -> Reservation:
        run = sub.run
        run_limits = Limits.from_dict(run.budgets)
        elapsed_ms = (clock.now() - run.created_at).total_seconds() * 1000
        if not sub.kind.engine:
            return budgets.plan_unmetered(run=run_limits, run_elapsed_ms=elapsed_ms)
        assert sub.llm is not None and sub.price is not None
        body = sub.body
        return budgets.plan(
            run=run_limits,
            step=Limits.from_dict(body.budgets.model_dump() if body.budgets else None),
            ledger=ledger,
            tokens_in=sub.tokens_in,
            max_tokens=sub.llm.params.max_tokens,
            price=sub.price,
            run_elapsed_ms=elapsed_ms,
        )

    async def _reserve_and_insert(
        self, sub: Submission, *, on_conflict: bool = False
    ) -> tuple[Step, Ledger]:
        run_id = sub.run_id
        ledger = ledger_of(sub.run)  # current on SQLite (the write lock is ours); re-read if stale
        run_limits = Limits.from_dict(sub.run.budgets)
        for attempt in range(3):
            try:
                reservation = self._plan(sub, ledger)
            except BudgetExceeded:
                if attempt == 0 and not sub.sqlite:
                    ledger = await read_ledger(sub.session, run_id=run_id)
                    continue
                raise
            taken = await reserve(sub.db, run_id=run_id, limits=run_limits, reservation=reservation)
            if taken is not None:
                break
            status, ledger = await read_account(sub.session, run_id=run_id)
            check_run_accepts_steps(RunStatus(status))  # it ended since it was read
        else:
            raise Conflict("the run's budget kept changing while reserving; retry", retriable=True)
        position, ledger_after = taken
        if sub.verdict == "drop_oldest":
            await _drop_oldest(sub.tx, sub.ctx.admission, sub.body.priority)
        target = sub.target
        if target is not None and position != target.position:
            raise Conflict(
                "the replay run's position moved during submission; retry", retriable=True
            )
        step = build_step(sub, position=position, reservation=reservation)
        if target is not None and target.recorded is not None:
            step.replay_of = target.recorded.step_id
            step.replica_id = target.recorded.replica_id  # pinned: the dispatcher honours it
        started = self._claim(sub, step)
        # a Core insert of the whole row: the unit of work costs more than the insert
        held = step.__dict__  # the columns as set (build_step, the claim), past the descriptors
        row = {c: held.get(c) for c in _STEP_COLUMNS}
        if sub.announce is not None:
            sub.announce(step)
        if on_conflict:  # PostgreSQL: a concurrent submission of the token committed first
            if await _INSERT_STEP_UNLESS_TOKEN.first(sub.db, row) is None:
                await unreserve(sub.session, run_id=run_id, reservation=reservation)
                raise _TokenTaken
        else:
            await _INSERT_STEP.rows(sub.db, row)
        self._begin_after_commit(sub, started)
        return step, ledger_after

    @staticmethod
    def _begin_after_commit(sub: Submission, started: ClaimedStep | None) -> None:
        if started is not None:
            starter = sub.ctx.starter
            assert starter is not None
            sub.tx.after_commit(lambda: starter.begin(started))

    @staticmethod
    def _claim(sub: Submission, step: Step) -> ClaimedStep | None:
        """``StartNow`` took a slot: the step is inserted running, leased, on its replica."""
        slot, starter = sub.slot, sub.ctx.starter
        if slot is None or starter is None:
            return None
        starter.claim(step, slot.replica)
        return ClaimedStep(step, sub.run, sub.price, slot.pool, slot.replica)


_ADMIT = Admit()
RULES: tuple[Rule, ...] = (
    LoadRun(),
    ResolveKind(),
    Place(),
    Police(),
    BoundPrompt(),
    MatchRecord(),
    Quote(),
    StartNow(),
    _ADMIT,
    Insert(),
)


async def submit_step(
    tx: Tx,
    *,
    run_id: str,
    body: AnyStepCreate,
    ctx: SubmitContext,
    announce: Callable[[Step], None] | None = None,
) -> Submitted:
    """Store a step once per (run, client_token); a repeat returns the first (created=False).

    ``announce`` is called with a new step just before the statement that stores it (which
    may commit the transaction by itself, ``Insert``): what must be in place before the
    step exists, and must not fail after, goes there. A step announced may still not be the
    one returned (its token taken meanwhile, a budget read again)."""
    with tracing.span("step.submit", run_id=run_id, kind=body.type) as span:
        answer = None
        kept = None
        kind = KINDS.get(body.type)  # (one that reads its flow begins a transaction)
        if not tx.sqlite and can_run_alone(tx.target) and kind and not kind.uses_flow:
            kept = ctx.runs.get(run_id)
        if kept is not None:
            sub = Submission(tx=tx, ctx=ctx, run_id=run_id, body=body, announce=announce)
            sub.kept = kept
            answer = await _from_kept(sub)
        if answer is None:
            sub = Submission(tx=tx, ctx=ctx, run_id=run_id, body=body, announce=announce)
            answer = await _apply(sub)
        tracing.submitted(span, answer.step, created=answer.created)
        return answer


async def _apply(sub: Submission) -> Submitted:
    for rule in RULES:
        answer = await rule.apply(sub)
        if answer is not None:
            return answer
    raise AssertionError("the last rule always answers")  # pragma: no cover


async def _from_kept(sub: Submission) -> Submitted | None:
    """The submission from the run as kept; None where a fresh read must decide (nothing
    was written: the slot a rule took is given back)."""
    try:
        answer = await _apply(sub)
    except (ReadAgain, OrchestratorError):
        if sub.slot is not None:
            sub.slot.release()
        return None
    assert sub.subject is not None  # stored: it was allowed
    record_decision(sub.ctx.metrics, sub.run_id, sub.subject, sub.decision)
    return answer


def build_step(sub: Submission, *, position: int, reservation: Reservation | None) -> Step:
    body = sub.body
    cod = body.cancel_on_disconnect
    if cod is None:
        cod = sub.run.cancel_on_disconnect
    metered = reservation is not None and sub.kind.engine
    return transient(
        Step,
        dict(
            step_id=clock.new_id("step"),
            run_id=sub.run_id,
            position=position,
            type=body.type,
            client_token=body.client_token,
            request_hash=sub.request_hash,
            input=sub.stored,
            budgets=body.budgets.model_dump() if body.budgets else None,
            placement=sub.placement,
            cancel_on_disconnect=sub.ctx.default_cancel_on_disconnect if cod is None else cod,
            status=StepStatus.QUEUED.value,
            priority=body.priority,
            priority_rank=PRIORITY_RANK[body.priority],
            max_tokens_granted=reservation.tokens_out if metered and reservation else None,
            budget_clamped=reservation.clamped if reservation else False,
            decode_seconds_granted=reservation.decode_seconds if reservation else None,
            tokens_in_reserved=reservation.tokens_in if reservation else 0,
            tokens_out_reserved=reservation.tokens_out if reservation else 0,
            cost_reserved_usd=reservation.cost_usd if reservation else 0.0,
            policy_decision={
                "rule_id": sub.decision.rule_id,
                "redactions": [r.rule_id for r in sub.decision.redactions],
            },
            cancel_requested=False,
            attempts=0,
            pool_id=sub.pool_id,
            tokens_in=0,
            tokens_out=0,
            cost_usd=0.0,
            created_at=clock.now(),
        ),
    )


def _require_ready_replica(pool: Pool, target: ReplayTarget) -> None:
    """A strict_replay step runs on its recorded replica only: refuse it, retriably, while
    that replica is not ready (as placement refuses a step when no pool is ready)."""
    replica_id = target.recorded.replica_id if target.recorded else None
    replica = pool.replica(replica_id or "")
    if replica is None or not replica.health.ready:
        raise PoolUnavailable(
            f"the recorded replica {pool.pool_id}/{replica_id} is not ready",
            details={"pool_id": pool.pool_id, "replica_id": replica_id},
            retry_after_ms=1000,
        )


async def _submit_unexecuted(sub: Submission, target: ReplayTarget) -> Submitted:
    """A replay step nothing runs again: served from the record, or ended with REPLAY_MISS."""
    session, run = sub.session, sub.run
    step = build_step(sub, position=target.position, reservation=None)
    run.step_count = target.position + 1
    run.updated_at = clock.now()
    session.add(step)
    await session.flush()
    if target.differs:
        step.replay_of = None if target.recorded is None else target.recorded.step_id
        step.replay_outcome = "miss"
        await end_unstarted(sub.tx, step=step, status=StepStatus.FAILED, error=target.miss_error())
    else:
        assert target.recorded is not None
        await serve_recorded(sub.tx, step=step, recorded=target.recorded)
    return Submitted(step, True, await read_ledger(session, run_id=run.run_id), run)


def record_decision(
    metrics: Metrics, run_id: str, subject: PolicySubject, decision: Decision
) -> None:
    """Count a policy decision and log it with the rule that made it (every one, once)."""
    metrics.policy.labels("allowed" if decision.allowed else "denied").inc()
    if policy_log.isEnabledFor(logging.INFO):  # the subject's dict only for a record kept
        policy_log.info(
            "policy %s by %s for %s",
            "allowed" if decision.allowed else "denied",
            decision.rule_id or "default",
            subject.as_dict(),
            extra={
                "run_id": run_id,
                "rule_id": decision.rule_id,
                "allowed": decision.allowed,
                "redactions": [r.rule_id for r in decision.redactions],
            },
        )


async def admission_lock(session: AsyncSession, priority: str) -> None:
    """Held to the end of the transaction; taking it again in the same one is a no-op wait."""
    await session.execute(
        sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": 70_000 + PRIORITY_RANK[priority]}
    )


async def _drop_oldest(tx: Tx, policy: AdmissionPolicy, priority: str) -> None:
    """Make room: the step that waited longest in this queue ends with QUEUE_FULL_DROP_LRU."""
    victim = (
        await tx.session.execute(
            sa.select(Step)
            .where(Step.status == StepStatus.QUEUED.value, Step.priority == priority)
            .order_by(Step.step_id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
    ).scalar_one_or_none()
    if victim is None:
        return
    error = dropped_error(priority, policy.capacity[priority])
    await end_unstarted(tx, step=victim, status=StepStatus.FAILED, error=error.body())
