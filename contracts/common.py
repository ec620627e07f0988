from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Request bodies: unknown fields are an error that names them."""

    model_config = ConfigDict(extra="forbid")


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Budgets(Strict):
    max_tokens_in: int | None = Field(default=None, ge=0)
    max_tokens_out: int | None = Field(default=None, ge=0)
    max_wall_ms: int | None = Field(default=None, ge=0)
    max_cost_usd: float | None = Field(default=None, ge=0)


class PinPlacement(Strict):
    pin: str = Field(min_length=1)


class AffinityPlacement(Strict):
    affinity: dict[str, str]


Placement = Literal["auto"] | PinPlacement | AffinityPlacement


def placement_to_json(value: Placement | None) -> Any:
    if value is None or isinstance(value, str):
        return value
    return value.model_dump()


class ErrorBody(BaseModel):
    code: str = Field(description="UPPER_SNAKE error code")
    message: str
    retriable: bool
    retry_after_ms: int | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    correlation_id: str | None = None
