from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from contracts.bounds import MAX_COST_USD, MAX_JSON_DEPTH, Count, check_storable


class Strict(BaseModel):
    """Request bodies: unknown fields are an error that names them; every field holds what
    can be stored and read back (``contracts.bounds``): finite floats, no value nested deeper
    than ``json_depth`` levels, integers within 64 bits, no lone surrogate."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    json_depth: ClassVar[int] = MAX_JSON_DEPTH

    @field_validator("*")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return check_storable(value, cls.json_depth)


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Budgets(Strict):
    max_tokens_in: Count | None = Field(default=None, description="0..2^53-1 prompt tokens")
    max_tokens_out: Count | None = Field(default=None, description="0..2^53-1 output tokens")
    max_wall_ms: Count | None = Field(default=None, description="0..2^53-1 milliseconds")
    max_cost_usd: float | None = Field(
        default=None, ge=0, le=MAX_COST_USD, description="0..1e9 USD, finite"
    )


class PinPlacement(Strict):
    pin: str = Field(min_length=1)


class AffinityPlacement(Strict):
    affinity: dict[str, str]


PLACEMENT_FORMS = '"auto", {"pin": pool_id} or {"affinity": {tag: value}}'


def _placement_form(value: Any) -> str | None:
    """Which form a placement is written in, told by its shape: errors then name only that
    form's fields (``placement.pin``), and a value in none of the forms gets one error
    saying what the field accepts."""
    if isinstance(value, PinPlacement):
        return "pin"
    if isinstance(value, AffinityPlacement):
        return "affinity"
    if value == "auto":
        return "auto"
    if isinstance(value, dict):
        for form in ("pin", "affinity"):
            if form in value:
                return form
    return None


Placement = Annotated[
    Annotated[Literal["auto"], Tag("auto")]
    | Annotated[PinPlacement, Tag("pin")]
    | Annotated[AffinityPlacement, Tag("affinity")],
    Discriminator(
        _placement_form,
        custom_error_type="placement_form",
        custom_error_message=f"must be {PLACEMENT_FORMS}",
    ),
]
PLACEMENT_TAGS = frozenset({"auto", "pin", "affinity"})


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
