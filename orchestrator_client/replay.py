"""Replaying a recorded run as an interpreter would (``orchctl replay``, CI jobs).

The replay is a ``replay`` (``strict_replay``) run of the same flow with the recorded seed;
the recorded steps are submitted again in position order, each followed to its end before
the next, and the server's replay report says what reproduced and, for what did not, the
first divergence.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from contracts.events import EndEvent, ErrorEvent, TokenEvent
from contracts.replay import ReplayReport
from contracts.steps import StepOut
from orchestrator_client.client import Client
from orchestrator_client.errors import ApiError, Unreachable

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class StepReplay:
    """How one re-submitted step ended, as its stream told it."""

    position: int
    recorded_step_id: str
    step_id: str | None
    tokens: int
    ended: str | None = None
    """``stop_reason`` of the ``end`` event."""
    error: JsonObject | None = None
    """The ``error`` event's body, or the refusal of the submission."""

    @property
    def outcome(self) -> str:
        if self.error is None:
            return f"end ({self.ended})"
        code = str(self.error.get("code", "ERROR"))
        details = self.error.get("details") or {}
        divergence = details.get("divergence") if isinstance(details, dict) else None
        if code == "REPLAY_DIVERGED" and isinstance(divergence, dict):
            return f"{code} at token {divergence.get('token_index')}"
        differs = details.get("differs") if isinstance(details, dict) else None
        if code == "REPLAY_MISS" and isinstance(differs, list):
            return f"{code} (differs: {', '.join(map(str, differs))})"
        return code


def derived_input(document: JsonObject) -> dict[str, frozenset[str]]:
    """Per step type, the fields the server adds to a step's stored input (a plan's tool
    schemas and template, resolved from the flow when it was submitted), as an OpenAPI
    document tells them: the ``readOnly`` properties of the ``input`` of each step request
    (a schema whose ``type`` is a constant and whose ``input`` is a reference)."""
    schemas = document.get("components", {}).get("schemas", {})
    derived: dict[str, frozenset[str]] = {}
    for schema in schemas.values():
        properties = schema.get("properties") or {}
        step_type = (properties.get("type") or {}).get("const")
        ref = (properties.get("input") or {}).get("$ref")
        if not isinstance(step_type, str) or not isinstance(ref, str):
            continue
        target = schemas.get(ref.rsplit("/", 1)[-1]) or {}
        fields = frozenset(
            name
            for name, prop in (target.get("properties") or {}).items()
            if isinstance(prop, dict) and prop.get("readOnly") is True
        )
        if fields:
            derived[step_type] = fields
    return derived


@functools.cache
def contract_derived_input() -> dict[str, frozenset[str]]:
    """``derived_input`` of the contract this client ships with (``contracts/openapi.json``,
    package data), read on first use."""
    document = json.loads(resources.files("contracts").joinpath("openapi.json").read_text())
    return derived_input(document)


def replay_step_body(recorded: StepOut | JsonObject) -> JsonObject:
    """The submission that repeats a recorded step (placement is the replay run's business):
    its stored input less what the server derived from it."""
    step = recorded.model_dump(mode="json") if isinstance(recorded, StepOut) else recorded
    derived = contract_derived_input().get(str(step["type"]), frozenset())
    stored = step.get("input") or {}
    return {
        "type": step["type"],
        "client_token": step["client_token"],
        "input": {k: v for k, v in stored.items() if k not in derived},
        "budgets": step.get("budgets"),
        "placement": None,
        "priority": step.get("priority") or "interactive",
    }


def follow_to_end(client: Client, step_id: str) -> tuple[int, str | None, JsonObject | None]:
    """(tokens, stop_reason, error body) of a step, read from its stream."""
    seen: set[int] = set()
    for event in client.stream_step(step_id):
        if isinstance(event, TokenEvent):
            seen.add(event.i)
        elif isinstance(event, EndEvent):
            return event.tokens_out, event.stop_reason, None
        elif isinstance(event, ErrorEvent):
            return len(seen), None, event.model_dump(mode="json", exclude={"step_id", "seq"})
    raise Unreachable(f"the stream of {step_id} ended without an end or error event")


def replay_run(
    client: Client,
    run_id: str,
    *,
    strict: bool = False,
    on_step: Callable[[StepReplay], None] | None = None,
) -> tuple[str, ReplayReport]:
    """Replay a recorded run; returns (replay run id, replay report).

    A submission the server refuses (4xx) is reported to ``on_step`` and the replay goes on;
    the report then says what was not replayed.
    """
    recorded = client.get_run(run_id)
    steps = client.list_steps(run_id)
    replay = client.create_run(
        recorded.flow_id,
        {
            "mode": "strict_replay" if strict else "replay",
            "source_run_id": run_id,
            "seed": recorded.seed,
        },
    )
    for step in sorted(steps, key=lambda s: s.position):
        try:
            accepted = client.submit_step(replay.run_id, replay_step_body(step))
        except ApiError as exc:
            if exc.status >= 500:
                raise
            result = StepReplay(step.position, step.step_id, None, 0, error=exc.body)
        else:
            tokens, ended, error = follow_to_end(client, accepted.step_id)
            result = StepReplay(step.position, step.step_id, accepted.step_id, tokens, ended, error)
        if on_step is not None:
            on_step(result)
    return replay.run_id, client.replay_report(replay.run_id)
