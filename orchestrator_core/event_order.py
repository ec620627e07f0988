"""The per-step event grammar of the contract:

    started -> [token | tool_suggest | fact | metrics | narration]* -> [checkpoint]? -> end | error

A producer feeds each event type to :class:`EventOrder` before appending it; anything out of
order is a bug in the producer and is refused.
"""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    STARTED = "started"
    TOKEN = "token"
    TOOL_SUGGEST = "tool_suggest"
    FACT = "fact"
    METRICS = "metrics"
    NARRATION = "narration"
    CHECKPOINT = "checkpoint"
    END = "end"
    ERROR = "error"
    ESCALATION = "escalation"


BODY_TYPES = frozenset(
    {
        EventType.TOKEN,
        EventType.TOOL_SUGGEST,
        EventType.FACT,
        EventType.METRICS,
        EventType.NARRATION,
        EventType.ESCALATION,
    }
)
TERMINAL_TYPES = frozenset({EventType.END, EventType.ERROR})
DROPPABLE_TYPES = frozenset({EventType.METRICS, EventType.NARRATION})


class EventOrderError(RuntimeError):
    pass


class EventOrder:
    """Tracks one step's log and refuses an event that breaks the grammar."""

    __slots__ = ("_phase", "next_seq")

    def __init__(self) -> None:
        self._phase = "new"  # new -> body -> checkpointed -> closed
        self.next_seq = 0

    @property
    def closed(self) -> bool:
        return self._phase == "closed"

    def resume(self, next_seq: int) -> None:
        """Go on with a log that already holds ``next_seq`` events, ``started`` first and no
        terminal event (a step queued again after its process was lost)."""
        self._phase = "body"
        self.next_seq = next_seq

    def accept(self, event_type: EventType) -> int:
        """Admit ``event_type`` and return its seq."""
        phase = self._phase
        if phase == "closed":
            raise EventOrderError(f"{event_type} after the terminal event")
        if event_type is EventType.STARTED:
            if phase != "new":
                raise EventOrderError("started may only be the first event")
            self._phase = "body"
        elif phase == "new":
            raise EventOrderError(f"{event_type} before started")
        elif event_type in TERMINAL_TYPES:
            self._phase = "closed"
        elif event_type is EventType.CHECKPOINT:
            if phase == "checkpointed":
                raise EventOrderError("at most one checkpoint per step")
            self._phase = "checkpointed"
        elif event_type in BODY_TYPES:
            if phase == "checkpointed":
                raise EventOrderError(f"{event_type} after the checkpoint")
        else:  # pragma: no cover - the enum is closed
            raise EventOrderError(f"unknown event type {event_type}")
        seq = self.next_seq
        self.next_seq += 1
        return seq
