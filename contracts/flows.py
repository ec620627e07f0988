from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from contracts.common import Out, Strict


class HttpExecutor(Strict):
    kind: Literal["http"]
    url: str = Field(min_length=1)
    timeout_ms: int | None = Field(default=None, gt=0)


class BuiltinExecutor(Strict):
    kind: Literal["builtin"]
    name: str = Field(min_length=1)


class Tool(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
    description: str = ""
    parameters: dict[str, Any] = Field(description="JSON Schema 2020-12 of the tool's arguments")
    executor: HttpExecutor | BuiltinExecutor = Field(discriminator="kind")


class FlowCreate(Strict):
    ast: Any = Field(description="The normalized program, any JSON")
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
