"""Event payloads of the step and run streams (SSE ``data:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

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


class EventBase(BaseModel):
    step_id: str | None
    seq: int | None
    type: str


class StartedEvent(EventBase):
    pool_id: str | None
    replica_id: str | None
    engine: str | None


class TokenEvent(EventBase):
    i: int
    t: str
    token_id: int | None


class EndEvent(EventBase):
    stop_reason: StopReason
    tokens_in: int
    tokens_out: int
    provenance: Provenance
