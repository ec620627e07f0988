"""Facts, checkpoints and pools."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from contracts.bounds import RequiredJson, RetryToken, Text
from contracts.common import Out, Strict


class FactCreate(Strict):
    type: Text = Field(min_length=1, max_length=200)
    data: RequiredJson = Field(description="any JSON but null")
    schema_uri: Text | None = None
    step_id: Text | None = Field(default=None, description="the step that emitted the fact")
    client_token: RetryToken = None


class FactOut(Out):
    fact_id: str
    run_id: str
    type: str
    schema_uri: str | None
    data: Any
    emitted_by_step: str | None
    created_at: datetime


class CheckpointCreate(Strict):
    state: dict[str, Any]
    step_id: Text | None = None
    client_token: RetryToken = None


class CheckpointOut(Out):
    checkpoint_id: str
    run_id: str
    step_id: str | None
    state: dict[str, Any]
    state_hash: str
    cursors: dict[str, Any] | None = Field(
        default=None, description="last_fact_id, last_step_position, usage when it was taken"
    )
    created_at: datetime


class BreakerOut(Out):
    state: Literal["closed", "open", "half_open"] = "closed"
    failures: int = Field(default=0, description="consecutive failures counted")


class ReplicaOut(Out):
    replica_id: str
    url: str | None
    model: str | None
    slots: int
    busy: int
    free: int
    health: dict[str, Any]
    state: str = Field(
        default="ready",
        description="whether it takes new steps: ready | unready (its health) | draining (an"
        " operator's drain) | breaker_open (its circuit breaker fails calls fast)",
    )
    breaker: BreakerOut = Field(
        default_factory=BreakerOut,
        description="the circuit breaker of calls to it, as the answering process keeps it",
    )
    capabilities: dict[str, Any] = Field(
        default_factory=dict,
        description="what it serves: engine, engine_version, model, model_hash and "
        "quantization as its engine reports them; models (as configured and reported), "
        "features, context_size (null until reported) and gpu ({arch, vram_gib, count} as "
        "declared in the pools file, or null)",
    )


class PoolOut(Out):
    pool_id: str
    engine: str
    tags: dict[str, str]
    capabilities: dict[str, Any] = Field(
        description="what its engine reports (its first replica's), with the pool's models "
        "(every replica's), features (those every replica offers), context_size (the "
        "smallest) and gpu ({arch, vram_gib, count}: the GPUs of all its replicas, the "
        "smallest memory, the arch they share or null; null unless every replica declares "
        "its GPUs)"
    )
    price: dict[str, Any] | None = Field(
        default=None,
        description="the pool's own price from pools.yaml, as written there (it wins over the "
        "price table); null: its steps are priced by the run's price table",
    )
    health: str
    load: dict[str, int]
    replicas: list[ReplicaOut]
    source: str | None = Field(
        default=None,
        description="where it comes from: file (the pools file), api (POST /v1/pools) or "
        "provisioned (POST /v1/pools/provision); null: built into the process",
    )
    provision: dict[str, Any] | None = Field(
        default=None,
        description="a provisioned pool's: provisioner, owner (the instance that started its "
        "engines), idle_ttl_s, engines [{replica_id, pid, port, url, log}], request",
    )
