"""Event payloads of the step and run streams (SSE ``data:``).

Producers build every event through these models (``orchestratord.eventlog.StepLog.emit``);
the log adds ``step_id`` and ``seq``. Fields a producer leaves unset are left out of the
stored JSON, so an event carries what its producer knows, no more.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

StopReason = Literal["eos", "length", "stop", "cancelled", "budget"]


class Provenance(BaseModel):
    """What produced a step's output. Control-plane kinds (tools) fill ``prompt_hash`` with
    the hash of their normalized input and ``engine`` with ``tool:<executor kind>``."""

    seed: int
    prompt_hash: str
    params_hash: str
    engine: str
    engine_version: str | None
    model_hash: str | None
    pool_id: str | None
    replica_id: str | None
    tokens_in: int
    tokens_out: int
    cost_usd: float | None = Field(
        description="USD at the step's price; null when its model has no price (not tracked)"
    )
    decode_time_ms: float
    policy_hash: str | None = None
    price_table: str | None = None
    price: dict[str, Any] | None = Field(
        default=None,
        description="engine kinds: the price the step ran at, {source: pool|table|unpriced, "
        "...rates as written in pools.yaml or the price table}",
    )
    model: str | None = Field(default=None, description="the model name the engine served")
    tool: str | None = Field(default=None, description="tool_call: the tool called")
    target: str | None = Field(default=None, description="tool_call: the endpoint called")
    replayed_from: str | None = Field(
        default=None, description="replay: the recorded step whose events were served"
    )


class EventBase(BaseModel):
    event_type: ClassVar[str] = ""

    step_id: str | None = None
    seq: int | None = None
    type: str = ""


class StartedEvent(EventBase):
    """What decides the step's output, known before its first token (null for a step that
    ended before reaching an engine)."""

    event_type: ClassVar[str] = "started"
    pool_id: str | None
    replica_id: str | None
    engine: str | None
    engine_version: str | None = None
    model_hash: str | None = None
    model: str | None = None
    seed: int | None = None
    prompt_hash: str | None = None
    params_hash: str | None = None
    policy_hash: str | None = None
    price_table: str | None = None
    tool: str | None = None
    target: str | None = None
    replay_of: str | None = Field(
        default=None, description="strict_replay: the recorded step this one re-executes"
    )


class TokenEvent(EventBase):
    event_type: ClassVar[str] = "token"
    i: int
    t: str
    token_id: int | None
    logprob: float | None = Field(default=None, description="when the step asked for logprobs")
    top_logprobs: list[dict[str, Any]] | None = Field(
        default=None,
        description="when the step asked for logprobs on a pool whose replicas rank "
        "alternatives (options.top_logprobs: k): the k most likely tokens at this position, "
        'best first, each {"token_id", "t", "logprob"}',
    )


class ToolSuggestEvent(EventBase):
    """llm_plan: one suggested call, valid or not; invalid ones are reported, never dropped."""

    event_type: ClassVar[str] = "tool_suggest"
    tool: str | None
    args: Any
    valid: bool
    errors: list[dict[str, Any]]


class FactEvent(EventBase):
    """A fact the step appended to its run (tool_call: ``tool_result``); the same fields as
    a fact posted to the run, with ``emitted_by_step`` set."""

    event_type: ClassVar[str] = "fact"
    fact_id: str
    fact_type: str
    data: Any
    schema_uri: str | None
    emitted_by_step: str | None


class NarrationEvent(EventBase):
    """What the server is doing for the step, in words (placed, clamped, retrying, queued).

    Stored in the step's log when it happens after ``started``; while a step is queued, its
    streams are told its queue position in narration frames that are not stored (no ``id``).
    Never compared by strict_replay."""

    event_type: ClassVar[str] = "narration"
    text: str


class MetricsEvent(EventBase):
    """At most once a second on a long engine step; never compared by strict_replay."""

    event_type: ClassVar[str] = "metrics"
    tokens_per_s: float
    tokens_out: int
    tokens_budget_remaining: int | None = None
    time_budget_remaining_ms: float | None = None


class EscalationEvent(EventBase):
    """A circuit breaker changed state while this step used its target."""

    event_type: ClassVar[str] = "escalation"
    target: str
    state: Literal["closed", "open", "half_open"]
    failures: int
    reason: str


class EndEvent(EventBase):
    event_type: ClassVar[str] = "end"
    stop_reason: StopReason
    tokens_in: int
    tokens_out: int
    provenance: Provenance | None


class ErrorEvent(EventBase):
    """The contract's error body, plus the provenance of what ran before the error."""

    event_type: ClassVar[str] = "error"
    code: str
    message: str
    retriable: bool
    retry_after_ms: int | None
    details: dict[str, Any]
    correlation_id: str | None = None
    provenance: Provenance | None = None


class CheckpointEvent(EventBase):
    """checkpoint steps: the state was stored with the server's cursors (before ``end``)."""

    event_type: ClassVar[str] = "checkpoint"
    checkpoint_id: str
    state_hash: str
    cursors: dict[str, Any]


class RunEndEvent(EventBase):
    """The run's last event: sent after its last step's terminal event; the stream closes."""

    event_type: ClassVar[str] = "run_end"
    run_id: str
    status: str


STEP_EVENTS: tuple[type[EventBase], ...] = (
    StartedEvent,
    TokenEvent,
    ToolSuggestEvent,
    FactEvent,
    NarrationEvent,
    MetricsEvent,
    EscalationEvent,
    CheckpointEvent,
    EndEvent,
    ErrorEvent,
    RunEndEvent,
)
