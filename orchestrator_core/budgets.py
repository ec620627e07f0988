"""Budgets: plan a step's worst-case reservation before it runs.

A run's budget is shared by its steps; a step's own budget narrows it. Before a step runs,
its worst case is reserved against the run (``used + reserved + worst <= limit``) in one
atomic database operation; when it ends, the reservation is settled to actual usage. Since
every admitted step holds its worst case until it settles, concurrent steps cannot overshoot.

- ``max_tokens_in``: the prompt, counted with the engine's tokenizer where it has one, else
  its UTF-8 byte length (an upper bound for byte-level tokenizers).
- ``max_tokens_out``: ``max_tokens`` is clamped to what is left; a step left with nothing is
  refused. A clamped step that reaches its clamp ends with ``stop_reason: "budget"``.
- ``max_cost_usd``: the worst-case cost at the step's price (its pool's own, else the run's
  price table); for token prices, ``max_tokens`` is clamped further so the worst case fits.
  Per-second prices reserve what is left and stop the step when its decode time has used it.
  A model without a price is refused under a cost budget (:func:`require_price`); without
  one it runs, reserves no cost, and settles a cost of ``None`` that the run counts apart.
- ``max_wall_ms``: a run's wall clock starts at its creation; a step's at its start. A step
  is stopped (``budget``) at the earlier deadline; no step starts after the run's.

The rule a reservation keeps is written once, here: for each metered limit (``METERED``),
what settled steps used plus what running steps hold plus what this step would hold is at
most the limit (:func:`fits`). :func:`plan` applies it to the ledger a submission read;
the database applies the same function to the run's row as it reserves
(``orchestratord/runs/ledger.RESERVE``), so racing submissions cannot overshoot.
:class:`StepBudget` is what one submission asks of its budgets: the price check, the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from orchestrator_core import clock
from orchestrator_core.errors import OrchestratorError
from orchestrator_core.pricing import Price, Unpriced


class BudgetExceeded(OrchestratorError):
    code = "BUDGET_EXCEEDED"


@dataclass(frozen=True)
class Limits:
    max_tokens_in: int | None = None
    max_tokens_out: int | None = None
    max_wall_ms: int | None = None
    max_cost_usd: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Limits:
        if not data:
            return cls()
        return cls(**{name: data.get(name) for name in _LIMIT_NAMES})

    def narrow(self, other: Limits) -> Limits:
        """The tighter of two budgets, limit by limit."""

        def tight(a: Any, b: Any) -> Any:
            if a is None:
                return b
            if b is None:
                return a
            return min(a, b)

        return Limits(
            **{name: tight(getattr(self, name), getattr(other, name)) for name in _LIMIT_NAMES}
        )

    @property
    def any(self) -> bool:
        return any(getattr(self, name) is not None for name in _LIMIT_NAMES)


# read once: ``fields()`` walks the class on every call (a step submission reads two)
_LIMIT_NAMES = tuple(f.name for f in fields(Limits))


@dataclass(frozen=True)
class Ledger:
    """A run's account: what settled steps used and what running ones hold."""

    used_in: int = 0
    used_out: int = 0
    used_cost: float = 0.0
    reserved_in: int = 0
    reserved_out: int = 0
    reserved_cost: float = 0.0


@dataclass(frozen=True)
class Metered:
    """A limit a reservation counts against, by the names of its fields: the ``Limits``
    field, the ``Ledger``'s used and reserved fields, the ``Reservation``'s field."""

    limit: str
    used: str
    reserved: str
    need: str


METERED = (
    Metered("max_tokens_in", "used_in", "reserved_in", "tokens_in"),
    Metered("max_tokens_out", "used_out", "reserved_out", "tokens_out"),
    Metered("max_cost_usd", "used_cost", "reserved_cost", "cost_usd"),
)


def fits(used: Any, reserved: Any, need: Any, limit: Any) -> Any:
    """The budget rule, for one metered limit: what settled steps used, plus what running
    steps hold, plus what this step would hold, is at most the limit. On numbers (a bool),
    or on a statement's columns and parameters (its condition): the database checks the
    reservation by this very rule (``orchestratord/runs/ledger.RESERVE``)."""
    return used + reserved + need <= limit


# the plan rounds costs to 1e-9: a reservation planned to the limit fits with this much past it
COST_MARGIN = 1e-9
# a ledger not read (a run as a process kept it) may hold more than it shows: a reservation
# planned on it fits only with room to spare for the plan's rounding, so that the ledger,
# whatever it holds now, gives this very reservation; at the boundary a fresh read decides
UNREAD_COST_MARGIN = -2 * COST_MARGIN


@dataclass(frozen=True)
class Remaining:
    tokens_in: int | None
    tokens_out: int | None
    cost_usd: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": self.cost_usd,
        }


def remaining(limits: Limits, ledger: Ledger) -> Remaining:
    """What each limit leaves (None: no limit): the room :func:`fits` checks a need against,
    never below 0."""

    def left(limit: float | None, used: float, reserved: float) -> Any:
        return None if limit is None else max(0, limit - used - reserved)

    cost = left(limits.max_cost_usd, ledger.used_cost, ledger.reserved_cost)
    return Remaining(
        tokens_in=left(limits.max_tokens_in, ledger.used_in, ledger.reserved_in),
        tokens_out=left(limits.max_tokens_out, ledger.used_out, ledger.reserved_out),
        cost_usd=None if cost is None else round(cost, 9),
    )


@dataclass(frozen=True)
class Reservation:
    tokens_in: int
    tokens_out: int  # the granted max_tokens
    cost_usd: float
    clamped: bool  # max_tokens was lowered to fit the budget
    decode_seconds: float | None  # per-second pricing: decode time the reservation pays for

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": self.cost_usd,
        }


def require_price(
    price: Price, *, run: Limits, step: Limits, engine: str, model: str, price_table: str
) -> None:
    """A cost budget needs a price: an unpriced model is refused (``PRICE_UNKNOWN``) when the
    run or the step has ``max_cost_usd``, and may run untracked otherwise."""
    if not price.priced and (run.max_cost_usd is not None or step.max_cost_usd is not None):
        raise Unpriced(engine, model, price_table)


def plan(
    *,
    run: Limits,
    step: Limits,
    ledger: Ledger,
    tokens_in: int,
    max_tokens: int,
    price: Price,
    run_elapsed_ms: float,
) -> Reservation:
    """The reservation for a step, or :class:`BudgetExceeded` naming what does not fit."""
    left = remaining(run, ledger)
    held = ledger.reserved_in or ledger.reserved_out or ledger.reserved_cost

    def refuse(limit: str, scope: str, needed: float, available: float | None) -> BudgetExceeded:
        return BudgetExceeded(
            f"{scope} budget {limit} cannot fit this step (needs {needed}, {available} left)",
            details={
                "limit": limit,
                "scope": scope,
                "needed": needed,
                "available": available,
                "remaining": left.as_dict(),
            },
            # a refusal caused by reservations of running steps may fit once they settle
            retriable=bool(held) and scope == "run",
        )

    if run.max_wall_ms is not None and run_elapsed_ms >= run.max_wall_ms:
        raise refuse("max_wall_ms", "run", run_elapsed_ms, run.max_wall_ms)
    if step.max_tokens_in is not None and tokens_in > step.max_tokens_in:
        raise refuse("max_tokens_in", "step", tokens_in, step.max_tokens_in)
    if left.tokens_in is not None and tokens_in > left.tokens_in:
        raise refuse("max_tokens_in", "run", tokens_in, left.tokens_in)
    out = max_tokens
    for cap in (step.max_tokens_out, left.tokens_out):
        if cap is not None:
            out = min(out, cap)
    if out < 1:
        scope = "step" if step.max_tokens_out is not None and step.max_tokens_out < 1 else "run"
        raise refuse("max_tokens_out", scope, 1, out)
    cost_caps = [c for c in (step.max_cost_usd, left.cost_usd) if c is not None]
    cost_cap = min(cost_caps) if cost_caps else None
    if cost_cap is not None and not price.priced:
        raise ValueError("an unpriced model under a cost budget: require_price refuses it")
    decode_seconds: float | None = None
    if price.kind == "tokens" and cost_cap is not None:
        in_cost = price.cost(tokens_in, 0, 0.0)
        if in_cost > cost_cap:
            raise refuse("max_cost_usd", _cost_scope(step, left), in_cost, cost_cap)
        per_out = price.output_per_million / 1e6
        if per_out > 0:
            out = min(out, math.floor((cost_cap - in_cost) / per_out + 1e-9))
            if out < 1:
                raise refuse("max_cost_usd", _cost_scope(step, left), in_cost + per_out, cost_cap)
        cost = price.cost(tokens_in, out, 0.0)
    elif price.kind == "decode_seconds" and cost_cap is not None:
        if price.per_second > 0:
            if cost_cap <= 0:
                raise refuse("max_cost_usd", _cost_scope(step, left), price.per_second, cost_cap)
            decode_seconds = cost_cap / price.per_second
            cost = cost_cap
        else:
            cost = 0.0
    else:
        worst = price.worst_case(tokens_in, out, None)
        cost = worst if worst is not None else 0.0
    return Reservation(
        tokens_in=tokens_in,
        tokens_out=out,
        cost_usd=round(cost, 9),
        clamped=out < max_tokens,
        decode_seconds=decode_seconds,
    )


@dataclass(frozen=True)
class StepBudget:
    """The budgets one step is submitted under: its run's limits, its own (which narrow
    them), and when its run began (the run's wall clock starts then)."""

    run: Limits
    step: Limits
    run_created_at: datetime

    @classmethod
    def of(
        cls,
        run_budgets: dict[str, Any] | None,
        step_budgets: dict[str, Any] | None,
        run_created_at: datetime,
    ) -> StepBudget:
        """From the run's and the step's ``budgets`` as stored (None: no limits)."""
        return cls(Limits.from_dict(run_budgets), Limits.from_dict(step_budgets), run_created_at)

    def run_elapsed_ms(self) -> float:
        return (clock.now() - self.run_created_at).total_seconds() * 1000

    def require_price(self, price: Price, *, engine: str, model: str, price_table: str) -> None:
        """See :func:`require_price`."""
        require_price(
            price, run=self.run, step=self.step, engine=engine, model=model, price_table=price_table
        )

    def plan(self, ledger: Ledger, *, tokens_in: int, max_tokens: int, price: Price) -> Reservation:
        """An engine step's reservation against ``ledger`` (see :func:`plan`), the run's wall
        clock read now."""
        return plan(
            run=self.run,
            step=self.step,
            ledger=ledger,
            tokens_in=tokens_in,
            max_tokens=max_tokens,
            price=price,
            run_elapsed_ms=self.run_elapsed_ms(),
        )

    def plan_unmetered(self) -> Reservation:
        """A step that uses no engine (see :func:`plan_unmetered`)."""
        return plan_unmetered(run=self.run, run_elapsed_ms=self.run_elapsed_ms())


def _cost_scope(step: Limits, left: Remaining) -> str:
    if step.max_cost_usd is not None and (
        left.cost_usd is None or step.max_cost_usd <= left.cost_usd
    ):
        return "step"
    return "run"


def step_deadline_ms(
    *, run: Limits, step: Limits, run_elapsed_ms: float, decode_seconds: float | None
) -> float | None:
    """Milliseconds a starting step may run before it is stopped with ``budget``."""
    candidates = []
    if step.max_wall_ms is not None:
        candidates.append(float(step.max_wall_ms))
    if run.max_wall_ms is not None:
        candidates.append(max(0.0, run.max_wall_ms - run_elapsed_ms))
    if decode_seconds is not None:
        candidates.append(decode_seconds * 1000)
    return min(candidates) if candidates else None


def plan_unmetered(*, run: Limits, run_elapsed_ms: float) -> Reservation:
    """The reservation of a step that uses no engine (a tool call, a gate): no tokens, no
    cost; only the run's wall budget can refuse it."""
    if run.max_wall_ms is not None and run_elapsed_ms >= run.max_wall_ms:
        raise BudgetExceeded(
            f"run budget max_wall_ms cannot fit this step (needs {run_elapsed_ms}, "
            f"{run.max_wall_ms} left)",
            details={
                "limit": "max_wall_ms",
                "scope": "run",
                "needed": run_elapsed_ms,
                "available": run.max_wall_ms,
            },
        )
    return Reservation(tokens_in=0, tokens_out=0, cost_usd=0.0, clamped=False, decode_seconds=None)
