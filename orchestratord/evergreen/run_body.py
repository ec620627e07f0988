"""``x-run``: the JSON body of ``POST /v1/flows/{id}/runs``, read as the HTTP door reads that
body: at most ``limits.max_body_bytes`` (``RESOURCE_EXHAUSTED``), an object naming a key twice
refused (``orchestrator_core.json_keys``), then validated into the same ``RunCreate``, each
error naming its field as the HTTP door's 422 does, under ``x-run`` (``x-run.seed``;
``INVALID_ARGUMENT``). At most :data:`MAX_ERRORS` errors are listed."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from contracts.error_fields import field_of
from contracts.runs import RunCreate
from orchestrator_core.errors import InvalidParams, TooLarge
from orchestrator_core.json_keys import refuse

WHERE = "x-run"
MAX_ERRORS = 100


def run_body(text: str | None, *, max_bytes: int) -> RunCreate:
    """The run a session opens, from its ``x-run`` metadata (none: ``{}``)."""
    raw = (text or "{}").encode()
    if len(raw) > max_bytes:
        raise TooLarge(
            f"{WHERE} is at most {max_bytes} bytes, as a request body is (this one {len(raw)})",
            limit="limits.max_body_bytes",
            value=max_bytes,
            field=WHERE,
        )
    refuse(raw, where=WHERE)
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidParams(f"malformed JSON: {exc}", field=WHERE) from None
    try:
        return RunCreate.model_validate(value)
    except ValidationError as exc:
        raise _invalid(exc.errors()) from None


def _named(field: str) -> str:
    return f"{WHERE}.{field}" if field else WHERE


def _invalid(errors: list[Any]) -> InvalidParams:
    listed = [{"field": _named(field_of(e)), "message": e["msg"]} for e in errors[:MAX_ERRORS]]
    first = listed[0] if listed else {"field": WHERE, "message": "invalid"}
    return InvalidParams(first["message"], field=first["field"], details={"errors": listed})
