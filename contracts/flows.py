from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from contracts.bounds import MAX_INT, RequiredJson
from contracts.common import Out, Strict


class HttpExecutor(Strict):
    kind: Literal["http"]
    url: str = Field(min_length=1, pattern=r"^https?://", description="POSTed the args as JSON")
    timeout_ms: int | None = Field(
        default=None, gt=0, le=MAX_INT, description="per attempt, 1..2^53-1"
    )
    idempotent: bool | None = Field(
        default=None, description="the tool may be called again: failed calls are retried"
    )
    max_retries: int | None = Field(
        default=None, ge=0, le=10, description="retries of an idempotent tool (default: 2)"
    )
    max_reply_bytes: int | None = Field(
        default=None,
        gt=0,
        le=MAX_INT,
        description="a larger reply is a TOOL_ERROR (default: 1 MiB; 1..2^53-1)",
    )


class BuiltinExecutor(Strict):
    kind: Literal["builtin"]
    name: str = Field(min_length=1)


class Tool(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
    description: str = ""
    parameters: dict[str, Any] = Field(description="JSON Schema 2020-12 of the tool's arguments")
    executor: HttpExecutor | BuiltinExecutor = Field(discriminator="kind")


class FlowCreate(Strict):
    ast: RequiredJson = Field(description="The normalized program, any JSON but null")
    tools: list[Tool] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)


class FlowCreated(Out):
    flow_id: str
    hash: str
    created_at: datetime


class FlowOut(FlowCreated):
    ast: Any
    tools: list[dict[str, Any]]
    config: dict[str, Any]
    labels: dict[str, str]
