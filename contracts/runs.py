from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from contracts.bounds import Count, RetryToken, Text
from contracts.common import Budgets, Out, Placement, Strict

RunMode = Literal["record", "replay", "strict_replay"]
MAX_SEED = 2**63 - 1


class PolicyMatch(Strict):
    step_type: str | None = None
    tool: str | None = None
    model: str | None = None
    pool: str | None = None
    path: str | None = None


class PolicyRule(Strict):
    id: str = Field(min_length=1)
    effect: Literal["allow", "deny", "redact"]
    match: PolicyMatch = Field(default_factory=PolicyMatch)
    pattern: str | None = None


class Policy(Strict):
    rules: list[PolicyRule] = Field(default_factory=list)


class FsPolicy(Strict):
    roots: list[Text] = Field(default_factory=list)
    allow: list[Text] = Field(default_factory=list)
    deny: list[Text] = Field(default_factory=list)
    quota_bytes: Count | None = Field(default=None, description="0..2^53-1 bytes")
    quota_files: Count | None = Field(default=None, description="0..2^53-1 files")


class RunCreate(Strict):
    mode: RunMode = "record"
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    source_run_id: Text | None = Field(
        default=None, description="the recorded run; required for replay and strict_replay"
    )
    budgets: Budgets = Field(default_factory=Budgets)
    policy: Policy = Field(default_factory=Policy)
    pool_policy: Placement = "auto"
    fs_policy: FsPolicy = Field(default_factory=FsPolicy)
    cancel_on_disconnect: bool | None = None
    client_token: RetryToken = None


class Usage(Out):
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = Field(
        default=0.0, description="USD; null when not known (a step on a model without a price)"
    )


class RunUsage(Usage):
    """What a run's settled steps used. A step on a model without a price has no known cost,
    so neither has the run once it holds one: ``cost_usd`` is then null, and what is known is
    ``priced_cost_usd`` (the sum over priced steps, what a cost budget counts) and
    ``unpriced_steps``."""

    priced_cost_usd: float = Field(default=0.0, description="USD of the steps that had a price")
    unpriced_steps: int = Field(default=0, description="steps whose model had no price")


class RunOut(Out):
    run_id: str
    flow_id: str
    mode: RunMode
    seed: int
    source_run_id: str | None
    status: str
    budgets: dict[str, Any]
    usage: RunUsage
    reserved: Usage = Field(description="held by steps that have not settled yet")
    price_table: str = Field(description="price table version pinned at creation")
    policy_hash: str
    policy: dict[str, Any]
    pool_policy: Any
    fs_policy: dict[str, Any]
    cancel_on_disconnect: bool | None
    step_count: int
    output: dict[str, Any] | None = Field(
        default=None, description="what the interpreter gave when it completed the run"
    )
    ended_at: datetime | None = Field(
        default=None, description="when its last step ended after it completed or was cancelled"
    )
    forked_from: dict[str, Any] | None = Field(
        default=None, description="a fork: {run_id, checkpoint_id} it was made from"
    )
    created_at: datetime
    updated_at: datetime


class RunComplete(Strict):
    status: Literal["succeeded", "failed"]
    output: dict[str, Any] | None = None


class RunFork(Strict):
    checkpoint_id: Text = Field(min_length=1, description="a checkpoint of the run to fork")
    client_token: RetryToken = None


class CancelOut(Out):
    status: str
