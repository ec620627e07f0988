"""The database reserves by the budget rule itself (``budgets.fits``, which
``runs/ledger.RESERVE`` is built from): for each state of a run's ledger and limits, the
conditional UPDATE takes a step's reservation exactly when the rule says it fits, on SQLite
and PostgreSQL, and then holds it in the run's row."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestrator_core.budgets import COST_MARGIN, METERED, Ledger, Limits, Reservation, fits
from orchestratord.db.models import Run
from orchestratord.runs import ledger as run_ledger
from orchestratord.runtime import Orchestrator
from tests.helpers import make_run

LIMITS = {"max_tokens_in": 100, "max_tokens_out": 50, "max_cost_usd": 2.0}
SPENT = Ledger(
    used_in=40, used_out=10, used_cost=0.5, reserved_in=20, reserved_out=15, reserved_cost=0.25
)
# what each limit leaves after SPENT: 40 tokens in, 25 tokens out, 1.25 USD


def _need(tokens_in: int = 1, tokens_out: int = 1, cost: float = 0.0) -> Reservation:
    return Reservation(tokens_in, tokens_out, cost, clamped=False, decode_seconds=None)


CASES: dict[str, tuple[dict[str, Any] | None, Ledger, Reservation]] = {
    "within the budget": (LIMITS, SPENT, _need(10, 10, 0.5)),
    "at the edge of every limit": (LIMITS, SPENT, _need(40, 25, 1.25)),
    "over on tokens in": (LIMITS, SPENT, _need(41, 1)),
    "over on tokens out": (LIMITS, SPENT, _need(1, 26)),
    "over on cost": (LIMITS, SPENT, _need(cost=1.25 + 1e-6)),
    "within the plan's rounding of the cost limit": (LIMITS, SPENT, _need(cost=1.25 + 1e-10)),
    "no budget": (None, SPENT, _need(10**9, 10**9, 10.0**6)),
    "only a token budget, a cost of any size": ({"max_tokens_out": 50}, SPENT, _need(cost=1e6)),
}


def _rule_says(limits: Limits, ledger: Ledger, need: Reservation) -> bool:
    """The rule as ``plan`` keeps it, with the statement's allowance for the plan's rounding."""
    verdicts = []
    for m in METERED:
        limit = getattr(limits, m.limit)
        if limit is None:
            continue
        margin = COST_MARGIN if m.limit == "max_cost_usd" else 0
        used, held = getattr(ledger, m.used), getattr(ledger, m.reserved)
        verdicts.append(fits(used, held, getattr(need, m.need), limit + margin))
    return all(verdicts)


@pytest.mark.parametrize(("budgets", "spent", "need"), list(CASES.values()), ids=list(CASES))
async def test_the_database_reserves_by_the_budget_rule(
    orch: Orchestrator,
    client: httpx.AsyncClient,
    budgets: dict[str, Any] | None,
    spent: Ledger,
    need: Reservation,
) -> None:
    run_id = await make_run(client, budgets=budgets or {})
    async with orch.db.write() as session:
        await session.execute(
            sa.update(Run)
            .where(Run.run_id == run_id)
            .values(
                tokens_in_used=spent.used_in,
                tokens_out_used=spent.used_out,
                cost_used_usd=spent.used_cost,
                tokens_in_reserved=spent.reserved_in,
                tokens_out_reserved=spent.reserved_out,
                cost_reserved_usd=spent.reserved_cost,
            )
        )
    limits = Limits.from_dict(budgets)
    async with orch.db.write() as session:
        taken = await run_ledger.reserve(session, run_id=run_id, limits=limits, reservation=need)
    assert (taken is not None) is _rule_says(limits, spent, need)
    async with orch.db.read() as session:
        after = await run_ledger.read_ledger(session, run_id=run_id)
    if taken is None:
        assert after == spent  # nothing held
        return
    position, ledger = taken
    assert position == 0 and ledger == after
    assert (after.reserved_in, after.reserved_out) == (
        spent.reserved_in + need.tokens_in,
        spent.reserved_out + need.tokens_out,
    )
    assert after.reserved_cost == pytest.approx(spent.reserved_cost + need.cost_usd)
