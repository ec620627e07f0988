"""One step's record as an import reads it: what a kind's ``check_record`` is given.

A bundle's rows have been decoded and its event payloads checked against their types before a
kind sees them, so a kind checks only what it makes: how its output follows from its events.
A refusal is ``InvalidParams`` naming the field (``steps[3].output.suggestions``), with
``step_id`` and, when an event is at fault, its ``seq`` in the details.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from orchestrator_core.errors import InvalidParams

Row = dict[str, Any]


def refuse(
    message: str, *, field: str, step_id: str | None = None, seq: int | None = None
) -> NoReturn:
    """Refuse a bundle, naming the field at fault (and the step and event, when known)."""
    where: dict[str, Any] = {}
    if step_id is not None:
        where["step_id"] = step_id
    if seq is not None:
        where["seq"] = seq
    if step_id is not None:
        message += f" (step {step_id}" + (f", event seq {seq})" if seq is not None else ")")
    raise InvalidParams(message, field=field, details=where)


@dataclass
class RecordedEvent:
    """An event of the bundle, its ``data`` decoded (and valid for its type)."""

    index: int  # in the bundle's events
    seq: int | None
    run_seq: int
    type: str
    data: dict[str, Any]

    @property
    def path(self) -> str:
        return f"events[{self.index}]"


@dataclass
class StepRecord:
    """A step's row and its events in seq order, beside the bundle's rows it may name."""

    index: int  # in the bundle's steps
    row: Row
    run: Row
    events: list[RecordedEvent] = field(default_factory=list)  # by seq once checked
    facts: Mapping[str, tuple[int, Row]] = field(default_factory=dict)  # by fact_id
    checkpoints: Mapping[str, tuple[int, Row]] = field(default_factory=dict)  # by id

    @property
    def step_id(self) -> str:
        return str(self.row["step_id"])

    @property
    def path(self) -> str:
        return f"steps[{self.index}]"

    @property
    def output(self) -> Any:
        return self.row["output"]

    @property
    def recorded_here(self) -> bool:
        """A record run executed its steps; a replay run's step may serve another run's
        events (their facts and checkpoints were the recorded step's)."""
        return bool(self.run["mode"] == "record")

    def of_type(self, *types: str) -> list[RecordedEvent]:
        return [ev for ev in self.events if ev.type in types]

    def refuse(self, message: str, *, field: str, ev: RecordedEvent | None = None) -> NoReturn:
        refuse(message, field=field, step_id=self.step_id, seq=None if ev is None else ev.seq)
