"""The rules in their order, and ``submit_step``, which applies them: from the run as the
process kept it where it can, else from a read."""

from __future__ import annotations

from collections.abc import Callable

from contracts.steps import AnyStepCreate
from orchestrator_core.errors import OrchestratorError
from orchestratord import tracing
from orchestratord.db.models import Step
from orchestratord.db.prepared import can_run_alone
from orchestratord.steps.kinds import KINDS
from orchestratord.steps.submission.context import (
    ReadAgain,
    Rule,
    Submission,
    SubmitContext,
    Submitted,
)
from orchestratord.steps.submission.insert import Insert
from orchestratord.steps.submission.rules import (
    Admit,
    BoundPrompt,
    LoadRun,
    MatchRecord,
    Place,
    Police,
    Quote,
    ResolveKind,
    StartNow,
    record_decision,
    record_placement,
)
from orchestratord.tx import Tx

RULES: tuple[Rule, ...] = (
    LoadRun(),
    ResolveKind(),
    Place(),
    Police(),
    BoundPrompt(),
    MatchRecord(),
    Quote(),
    StartNow(),
    Admit(),
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
        if not tx.sqlite and can_run_alone(tx) and kind and not kind.uses_flow:
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
    if sub.placed is not None and answer.created:
        record_placement(sub.ctx.metrics, sub.placed)
    return answer
