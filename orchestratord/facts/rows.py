"""A new fact row: one builder for every writer of facts (a step's end, a replay's copy)."""

from __future__ import annotations

from typing import Any

from orchestrator_core import clock
from orchestratord.db.models import Fact


def fact_row(
    *,
    run_id: str,
    type: str,
    data: Any,
    emitted_by_step: str | None,
    schema_uri: str | None = None,
    fact_id: str | None = None,
) -> Fact:
    return Fact(
        fact_id=fact_id or clock.new_id("fact"),
        run_id=run_id,
        type=type,
        schema_uri=schema_uri,
        data=data,
        emitted_by_step=emitted_by_step,
        created_at=clock.now(),
    )
