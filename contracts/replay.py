"""The replay report of a replay or strict_replay run (``GET /v1/runs/{id}/replay-report``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from contracts.common import Out

Outcome = Literal["identical", "diverged", "miss", "failed", "cancelled", "pending", "not_replayed"]


class DivergenceContext(Out):
    before: list[str] = Field(description="the recorded tokens just before the divergence")
    expected_after: list[str] = Field(description="the recorded tokens just after it")


class Divergence(Out):
    step_id: str
    recorded_step_id: str | None
    position: int
    token_index: int
    expected: dict[str, Any] = Field(description='{"t", "token_id"} or {"end"} or {"error"}')
    actual: dict[str, Any] = Field(description='{"t", "token_id"} or {"end"} or {"error"}')
    context: DivergenceContext


class ReplayedStep(Out):
    position: int
    step_id: str | None = Field(description="null when the step was not replayed yet")
    recorded_step_id: str | None
    status: str | None
    outcome: Outcome
    tokens_out: int
    divergence: Divergence | None
    miss: dict[str, Any] | None = Field(description="REPLAY_MISS details: which inputs differ")


class ReplayCounts(Out):
    identical: int
    diverged: int
    missed: int
    failed: int
    pending: int
    not_replayed: int


class ReplayReport(Out):
    run_id: str
    source_run_id: str | None
    mode: str
    diverged: bool = Field(description="true when any step diverged, missed or failed")
    complete: bool = Field(description="every recorded step was replayed and has ended")
    counts: ReplayCounts
    steps: list[ReplayedStep]
