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


class AffinitySelector(Strict):
    """Pools chosen by what they are: every condition given must hold."""

    tags: dict[str, str] = Field(default_factory=dict, description="tags equal to these values")
    in_: dict[str, list[str]] = Field(
        default_factory=dict, alias="in", description="tags whose value is one of these"
    )
    not_in: dict[str, list[str]] = Field(
        default_factory=dict, description="tags absent, or whose value is none of these"
    )
    min_vram_gib: int | None = Field(
        default=None, ge=1, description="every replica declares a GPU with at least this"
    )
    features: list[str] = Field(default_factory=list, description="features the pool offers")

    model_config = ConfigDict(populate_by_name=True)


SELECTOR_KEYS = frozenset({"tags", "in", "not_in", "min_vram_gib", "features"})
AFFINITY_FORMS = '{tag: value} or a selector {"tags", "in", "not_in", "min_vram_gib", "features"}'


def affinity_form(value: Any) -> str | None:
    """A tag map (v1: every value a string) or a selector (a selector key whose value is
    not a string: ``{"min_vram_gib": 40}``; a tag named ``features`` keeps its v1 meaning)."""
    if isinstance(value, AffinitySelector):
        return "selector"
    if isinstance(value, dict):
        if any(k in SELECTOR_KEYS and not isinstance(v, str) for k, v in value.items()):
            return "selector"
        return "map"
    return None


Affinity = Annotated[
    Annotated[dict[str, str], Tag("map")] | Annotated[AffinitySelector, Tag("selector")],
    Discriminator(
        affinity_form,
        custom_error_type="affinity_form",
        custom_error_message=f"must be {AFFINITY_FORMS}",
    ),
]
AFFINITY_TAGS = frozenset({"map", "selector"})


class AffinityPlacement(Strict):
    affinity: Affinity


PLACEMENT_FORMS = '"auto", {"pin": pool_id} or {"affinity": {tag: value} or a selector}'


def placement_form(value: Any) -> str | None:
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
        placement_form,
        custom_error_type="placement_form",
        custom_error_message=f"must be {PLACEMENT_FORMS}",
    ),
]
PLACEMENT_TAGS = frozenset({"auto", "pin", "affinity"})


def placement_to_json(value: Placement | None) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, AffinityPlacement) and isinstance(value.affinity, AffinitySelector):
        return {"affinity": value.affinity.model_dump(by_alias=True, exclude_defaults=True)}
    return value.model_dump()


class ErrorBody(BaseModel):
    code: str = Field(description="UPPER_SNAKE error code")
    message: str
    retriable: bool
    retry_after_ms: int | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    correlation_id: str | None = None
