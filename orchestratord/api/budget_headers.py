"""``X-Budget-*`` response headers: what a run has left, for clients that pace themselves.

A header is present only when the run has that budget. Tokens are output tokens; every
figure already subtracts what running steps hold.
"""

from __future__ import annotations

from fastapi import Response

from orchestrator_core import clock
from orchestrator_core.budgets import Ledger, Limits, remaining
from orchestratord.db.models import Run
from orchestratord.steps.queries import ledger_of


def set_budget_headers(response: Response, run: Run, ledger: Ledger | None = None) -> None:
    """Headers from the run's budgets; ``ledger`` when the caller holds a fresher one."""
    limits = Limits.from_dict(run.budgets)
    if not limits.any:
        return
    left = remaining(limits, ledger or ledger_of(run))
    if left.tokens_out is not None:
        response.headers["X-Budget-Tokens-Remaining"] = str(left.tokens_out)
    if limits.max_wall_ms is not None:
        elapsed = (clock.now() - run.created_at).total_seconds() * 1000
        response.headers["X-Budget-Time-Remaining-Ms"] = str(
            max(0, int(limits.max_wall_ms - elapsed))
        )
    if left.cost_usd is not None:
        response.headers["X-Budget-Cost-Remaining"] = f"{left.cost_usd:.9f}".rstrip("0").rstrip(".")
