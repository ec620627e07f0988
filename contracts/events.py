"""Event payloads of the step and run streams (SSE ``data:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

StopReason = Literal["eos", "length", "stop", "cancelled", "budget"]


class Provenance(BaseModel):
    seed: int
    prompt_hash: str
    params_hash: str
    engine: str
    engine_version: str
    model_hash: str
    pool_id: str | None
    replica_id: str | None
    tokens_in: int
    tokens_out: int
    cost_usd: float
    decode_time_ms: float
    policy_hash: str | None = None
    price_table: str | None = None
    model: str | None = Field(default=None, description="the model name the engine served")
    replayed_from: str | None = Field(
        default=None, description="replay: the recorded step whose events were served"
    )


class EventBase(BaseModel):
    step_id: str | None
    seq: int | None
    type: str


class StartedEvent(EventBase):
    """What decides the step's output, known before its first token (null for a step that
    ended before reaching an engine)."""

    pool_id: str | None
    replica_id: str | None
    engine: str | None
    engine_version: str | None = None
    model_hash: str | None = None
    seed: int | None = None
    prompt_hash: str | None = None
    params_hash: str | None = None
    policy_hash: str | None = None
    price_table: str | None = None
    replay_of: str | None = Field(
        default=None, description="strict_replay: the recorded step this one re-executes"
    )


class TokenEvent(EventBase):
    i: int
    t: str
    token_id: int | None


class EndEvent(EventBase):
    stop_reason: StopReason
    tokens_in: int
    tokens_out: int
    provenance: Provenance
