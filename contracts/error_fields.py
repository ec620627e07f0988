"""The field a pydantic validation error names, as every error body of the API names it
(``details.errors[].field``): the HTTP door's 422 and the Evergreen door's ``x-run``."""

from __future__ import annotations

from typing import Any

from contracts.bounds import UNSTORABLE
from contracts.common import AFFINITY_TAGS, PLACEMENT_TAGS
from contracts.steps import STEP_TYPES

_TAG_ERRORS = frozenset({"union_tag_invalid", "union_tag_not_found"})
# A union told apart by a tag puts the tag in an error's path, where the client wrote none: a
# step's kind after the body (body.llm_call.input), a placement's form after its field
# (placement.pin.pin), an affinity's form after it. The tag is left out of the field named.
_TAGS_AFTER: dict[str, frozenset[str]] = {
    "body": frozenset(STEP_TYPES),
    "placement": PLACEMENT_TAGS,
    "pool_policy": PLACEMENT_TAGS,
    "affinity": AFFINITY_TAGS,
}


def field_at(loc: tuple[Any, ...], error_type: str = "") -> str:
    """The field of an error at ``loc`` (FastAPI's: ``("body", "seed")`` is ``seed``)."""
    if error_type in _TAG_ERRORS:  # the step type itself picks no kind
        return ".".join([*(str(p) for p in loc if p != "body"), "type"])
    untagged = [p for i, p in enumerate(loc) if not (i and p in _TAGS_AFTER.get(loc[i - 1], ()))]
    parts = [str(p) for p in untagged]
    if parts and parts[0] in ("body", "query", "path", "header"):
        head, rest = parts[0], parts[1:]
        return ".".join(rest) if head == "body" and rest else ".".join([head, *rest])
    return ".".join(parts)


def field_of(error: Any) -> str:
    """The field one pydantic error (an item of ``errors()``) names."""
    field = field_at(tuple(error["loc"]), error.get("type", ""))
    if error.get("type") == UNSTORABLE:  # the place inside a JSON value: ``data.a[2]``
        field += error.get("ctx", {}).get("at", "")
    return field
