"""Server-Sent Events, parsed by the WHATWG rules, and decoded into the contract's events."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict

from contracts.events import STEP_EVENTS, EventBase

JsonObject = dict[str, Any]
TERMINAL = frozenset({"end", "error", "run_end"})
"""Event types after which the server closes the stream."""


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event; ``id`` is its own ``id:`` field (None for an event sent without
    one, such as a queued step's position: the parser's ``last_event_id`` stays as it was)."""

    event: str
    data: str
    id: str | None = None

    def json(self) -> JsonObject:
        value = json.loads(self.data)
        if not isinstance(value, dict):
            raise ValueError(f"event {self.event!r} data is not a JSON object: {self.data[:80]!r}")
        return value


@dataclass
class SseParser:
    """Incremental SSE parser: feed it lines without their line ending.

    Comment lines (``: keep-alive``) are counted but produce no event; ``data:`` lines of one
    event are joined with newlines; an event is dispatched at the blank line after it.
    """

    last_event_id: str | None = None
    retry_ms: int | None = None
    comments: int = 0
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _with_id: bool = False

    def feed(self, line: str) -> SseEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_event_id = value
            self._with_id = True
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None  # unknown fields are ignored

    def _dispatch(self) -> SseEvent | None:
        data, event, with_id = self._data, self._event, self._with_id
        self._data, self._event, self._with_id = [], "", False
        if not data:
            return None
        return SseEvent(
            event=event or "message",
            data="\n".join(data),
            id=self.last_event_id if with_id else None,
        )


def parse_sse(text: str) -> list[SseEvent]:
    """Every complete event of an SSE body (an unterminated last event is dropped)."""
    parser = SseParser()
    events = []
    for line in text.removeprefix("\ufeff").splitlines():
        event = parser.feed(line)
        if event is not None:
            events.append(event)
    return events


class OtherEvent(EventBase):
    """An event type this client does not know (a newer server): its fields kept as sent."""

    model_config = ConfigDict(extra="allow")


_TYPES: dict[str, type[EventBase]] = {kind.event_type: kind for kind in STEP_EVENTS}


def decode(event: SseEvent) -> EventBase:
    """The contract's model of an event (``TokenEvent``, ``EndEvent``, ...), or
    :class:`OtherEvent` for a type this client does not know."""
    kind = _TYPES.get(event.event, OtherEvent)
    return kind.model_validate_json(event.data)
