"""The budget rule alone (``orchestrator_core.budgets``): a step's reservation, or the
refusal naming the limit it does not fit, for each state of its run's ledger and budgets.
No database and no server: the fixture builds the step's budgets and ledger from the
case, on a frozen clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator_core import clock
from orchestrator_core.budgets import (
    COST_MARGIN,
    METERED,
    BudgetExceeded,
    Ledger,
    Reservation,
    StepBudget,
    fits,
)
from orchestrator_core.pricing import Price, Unpriced

FREE = Price("free")
# 1 USD a token in, 2 USD a token out: costs read as token counts
TOKENS = Price("tokens", input_per_million=1_000_000, output_per_million=2_000_000)
PER_SECOND = Price("decode_seconds", per_second=0.5)
UNPRICED = Price("unpriced")
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Case:
    """A step submitted to a run: the run's budgets and ledger, the step's own budgets, its
    prompt's tokens and ``max_tokens``, its price, how long ago the run began."""

    run: dict[str, Any] | None = None
    step: dict[str, Any] | None = None
    ledger: Ledger = field(default_factory=Ledger)
    tokens_in: int = 10
    max_tokens: int = 20
    price: Price = FREE
    run_age_ms: float = 0.0


@dataclass(frozen=True)
class Submitted:
    budget: StepBudget
    case: Case

    def plan(self) -> Reservation:
        c = self.case
        self.budget.require_price(c.price, engine="sim", model="m", price_table="t")
        return self.budget.plan(
            c.ledger, tokens_in=c.tokens_in, max_tokens=c.max_tokens, price=c.price
        )


@pytest.fixture
def frozen() -> Iterator[clock.FrozenClock]:
    frozen = clock.FrozenClock(NOW)
    previous = clock.set_clock(frozen)
    try:
        yield frozen
    finally:
        clock.set_clock(previous)


@pytest.fixture
def submitted(request: pytest.FixtureRequest, frozen: clock.FrozenClock) -> Submitted:
    case: Case = request.param
    began = NOW - timedelta(milliseconds=case.run_age_ms)
    return Submitted(StepBudget.of(case.run, case.step, began), case)


def _reserved(tokens_out: int, cost: float = 0.0, *, clamped: bool = False) -> Reservation:
    return Reservation(
        tokens_in=10, tokens_out=tokens_out, cost_usd=cost, clamped=clamped, decode_seconds=None
    )


HELD = Ledger(used_out=30, reserved_out=10)  # 40 of the run's tokens out spent or held
SETTLED = Ledger(used_out=40)  # the same, all settled: nothing will come back

FITS = {
    "no budget": (Case(), _reserved(20)),
    "no budget, priced": (Case(price=TOKENS), _reserved(20, 50.0)),
    "within the run's budget": (Case(run={"max_tokens_out": 100}, ledger=HELD), _reserved(20)),
    "at the edge of tokens out": (Case(run={"max_tokens_out": 60}, ledger=HELD), _reserved(20)),
    "clamped to the tokens out left": (
        Case(run={"max_tokens_out": 55}, ledger=HELD),
        _reserved(15, clamped=True),
    ),
    "clamped by the step's own budget": (
        Case(run={"max_tokens_out": 100}, step={"max_tokens_out": 5}),
        _reserved(5, clamped=True),
    ),
    "at the edge of tokens in": (
        Case(run={"max_tokens_in": 25}, ledger=Ledger(used_in=10, reserved_in=5)),
        _reserved(20),
    ),
    "at the edge of cost": (Case(run={"max_cost_usd": 50.0}, price=TOKENS), _reserved(20, 50.0)),
    "at the edge of cost, with a ledger": (
        Case(
            run={"max_cost_usd": 75.0},
            ledger=Ledger(used_cost=20.0, reserved_cost=5.0),
            price=TOKENS,
        ),
        _reserved(20, 50.0),
    ),
    "clamped to the cost left": (
        Case(run={"max_cost_usd": 49.0}, price=TOKENS),
        _reserved(19, 48.0, clamped=True),
    ),
    "an unpriced model without a cost budget": (
        Case(run={"max_tokens_out": 100}, price=UNPRICED),
        _reserved(20),
    ),
    "just inside the run's wall clock": (
        Case(run={"max_wall_ms": 1000}, run_age_ms=999),
        _reserved(20),
    ),
}


@pytest.mark.parametrize(
    ("submitted", "expected"), list(FITS.values()), ids=list(FITS), indirect=["submitted"]
)
def test_a_step_that_fits_reserves_its_worst_case(
    submitted: Submitted, expected: Reservation
) -> None:
    reservation = submitted.plan()
    assert reservation == expected
    # what the database re-checks as it reserves (runs/ledger.RESERVE) holds for it
    limits = submitted.budget.run
    for m in METERED:
        limit = getattr(limits, m.limit)
        if limit is not None:
            margin = COST_MARGIN if m.limit == "max_cost_usd" else 0
            ledger = submitted.case.ledger
            used, held = getattr(ledger, m.used), getattr(ledger, m.reserved)
            assert fits(used, held, getattr(reservation, m.need), limit + margin), m.limit


def test_per_second_prices_reserve_what_is_left(frozen: clock.FrozenClock) -> None:
    budget = StepBudget.of({"max_cost_usd": 3.0}, None, NOW)
    ledger = Ledger(used_cost=1.0)
    reservation = budget.plan(ledger, tokens_in=10, max_tokens=20, price=PER_SECOND)
    assert reservation.cost_usd == 2.0 and reservation.decode_seconds == 4.0
    assert reservation.tokens_out == 20 and not reservation.clamped


REFUSED = {
    "over on tokens out, held by running steps": (
        Case(run={"max_tokens_out": 40}, ledger=HELD),
        ("max_tokens_out", "run", True),
    ),
    "over on tokens out, all settled": (
        Case(run={"max_tokens_out": 40}, ledger=SETTLED),
        ("max_tokens_out", "run", False),
    ),
    "over on tokens in": (
        Case(run={"max_tokens_in": 24}, ledger=Ledger(used_in=10, reserved_in=5)),
        ("max_tokens_in", "run", True),
    ),
    "over the step's own tokens in": (
        Case(run={"max_tokens_in": 100}, step={"max_tokens_in": 9}),
        ("max_tokens_in", "step", False),
    ),
    "over the step's own tokens out": (
        Case(step={"max_tokens_out": 0}),
        ("max_tokens_out", "step", False),
    ),
    "over on cost: not one token out fits": (
        Case(run={"max_cost_usd": 11.0}, price=TOKENS),
        ("max_cost_usd", "run", False),
    ),
    "over on cost: the prompt alone": (
        Case(run={"max_cost_usd": 9.0}, price=TOKENS),
        ("max_cost_usd", "run", False),
    ),
    "over on cost, held by running steps": (
        Case(run={"max_cost_usd": 30.0}, ledger=Ledger(reserved_cost=25.0), price=TOKENS),
        ("max_cost_usd", "run", True),
    ),
    "over the step's own cost": (
        Case(run={"max_cost_usd": 100.0}, step={"max_cost_usd": 5.0}, price=TOKENS),
        ("max_cost_usd", "step", False),
    ),
    "over on cost at a price per second": (
        Case(run={"max_cost_usd": 1.0}, ledger=Ledger(used_cost=1.0), price=PER_SECOND),
        ("max_cost_usd", "run", False),
    ),
    "past the run's wall clock": (
        Case(run={"max_wall_ms": 1000}, run_age_ms=1000),
        ("max_wall_ms", "run", False),
    ),
}


@pytest.mark.parametrize(
    ("submitted", "expected"), list(REFUSED.values()), ids=list(REFUSED), indirect=["submitted"]
)
def test_a_step_that_does_not_fit_is_refused_naming_the_limit(
    submitted: Submitted, expected: tuple[str, str, bool]
) -> None:
    limit, scope, retriable = expected
    with pytest.raises(BudgetExceeded) as info:
        submitted.plan()
    assert info.value.code == "BUDGET_EXCEEDED"
    assert (info.value.details["limit"], info.value.details["scope"]) == (limit, scope)
    assert info.value.retriable is retriable


@pytest.mark.parametrize(
    "submitted",
    [
        Case(run={"max_cost_usd": 1.0}, price=UNPRICED),
        Case(step={"max_cost_usd": 1.0}, price=UNPRICED),
    ],
    ids=["the run's", "the step's"],
    indirect=True,
)
def test_a_cost_budget_refuses_an_unpriced_model(submitted: Submitted) -> None:
    with pytest.raises(Unpriced):
        submitted.plan()


@pytest.mark.parametrize(
    ("run", "age_ms", "refused"),
    [(None, 10**9, False), ({"max_tokens_out": 0}, 0, False), ({"max_wall_ms": 5}, 5, True)],
    ids=["no budget", "token budgets do not apply", "past the run's wall clock"],
)
def test_a_step_without_an_engine_is_refused_by_the_wall_clock_only(
    frozen: clock.FrozenClock, run: dict[str, Any] | None, age_ms: int, refused: bool
) -> None:
    budget = StepBudget.of(run, None, NOW - timedelta(milliseconds=age_ms))
    if refused:
        with pytest.raises(BudgetExceeded) as info:
            budget.plan_unmetered()
        assert info.value.details["limit"] == "max_wall_ms"
        return
    assert budget.plan_unmetered() == Reservation(0, 0, 0.0, False, None)


def test_the_run_wall_clock_is_read_when_the_step_is_planned(
    frozen: clock.FrozenClock,
) -> None:
    budget = StepBudget.of({"max_wall_ms": 1000}, None, NOW)
    budget.plan(Ledger(), tokens_in=1, max_tokens=1, price=FREE)
    frozen.advance(1.0)
    with pytest.raises(BudgetExceeded):
        budget.plan(Ledger(), tokens_in=1, max_tokens=1, price=FREE)
