"""What a gate reads: the run and its latest facts, as the JSON an evaluation is sent, and
a fingerprint of them that changes when a fact is appended or a step settles.

The facts a gate sees are the latest that fit ``max_input_bytes`` of JSON (and at most
``MAX_FACTS``). Their sizes are read first, as the database writes their text, so a run
holding many large facts is never read whole into the server's memory: only the window is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from orchestrator_core.gates import MAX_FACTS
from orchestratord.db import json_codec
from orchestratord.db.engine import Database
from orchestratord.db.models import Fact, Run
from orchestratord.runs.ledger import usage_of

_ENVELOPE = 300  # a fact's JSON besides its data: type (<= 200), step id, time, keys

_SIZES = (
    sa.select(Fact.id, sa.func.length(sa.cast(Fact.data, sa.Text)))
    .where(Fact.run_id == sa.bindparam("run_id"))
    .order_by(Fact.id.desc())
    .limit(MAX_FACTS)
)
_ROWS = (
    sa.select(Fact.type, Fact.data, Fact.emitted_by_step, Fact.created_at)
    .where(Fact.run_id == sa.bindparam("run_id"), Fact.id >= sa.bindparam("first"))
    .order_by(Fact.id)
)
_OF_RUN = Fact.run_id == sa.bindparam("run_id")
_FINGERPRINT = sa.select(
    sa.select(sa.func.count(Fact.id)).where(_OF_RUN).scalar_subquery(),
    sa.select(sa.func.max(Fact.id)).where(_OF_RUN).scalar_subquery(),
    Run.tokens_in_used,
    Run.tokens_out_used,
    Run.cost_used_usd,
    Run.unpriced_steps,
    Run.budgets,
).where(Run.run_id == sa.bindparam("run_id"))


@dataclass(frozen=True)
class Activation:
    """One evaluation's request: ``{"expr", "run", "facts"}`` as JSON."""

    payload: bytes
    input_bytes: int  # of ``run`` and ``facts``
    facts: int


async def read_activation(
    db: Database, run_id: str, expr: str, *, max_input_bytes: int
) -> Activation:
    async with db.read() as session:
        sizes = (await session.execute(_SIZES, {"run_id": run_id})).all()
        first = _first_id(sizes, max_input_bytes)
        rows = (
            (await session.execute(_ROWS, {"run_id": run_id, "first": first})).all()
            if first is not None
            else []
        )
        run = (await session.execute(sa.select(Run).where(Run.run_id == run_id))).scalar_one()
        view = {"run_id": run.run_id, "usage": usage_of(run), "budgets": run.budgets}
    head = _json(view)
    facts = [
        _json({"type": t, "data": d, "step_id": s, "ts": c.isoformat()}) for t, d, s, c in rows
    ]
    total, keep = len(head), 0
    for part in reversed(facts):  # the text's size is near its JSON's, not always equal
        if total + len(part) + 1 > max_input_bytes:
            break
        total += len(part) + 1
        keep += 1
    kept = facts[len(facts) - keep :]
    payload = b"".join(
        [b'{"expr":', _json(expr), b',"run":', head, b',"facts":[', b",".join(kept), b"]}"]
    )
    return Activation(payload, total, keep)


async def read_fingerprint(db: Database, run_id: str) -> tuple[Any, ...]:
    """Changes when a fact is appended to the run, or one of its steps settles (its usage)."""
    async with db.read() as session:
        return tuple((await session.execute(_FINGERPRINT, {"run_id": run_id})).one())


def _first_id(sizes: list[Any], max_input_bytes: int) -> int | None:
    """The oldest fact of the window, newest first: None when not even the latest fits."""
    total, first = 0, None
    for fact_id, length in sizes:
        total += (length or 0) + _ENVELOPE
        if total > max_input_bytes:
            break
        first = fact_id
    return first


def _json(value: Any) -> bytes:
    return json_codec.dumps(value).encode()
