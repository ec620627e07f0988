"""The per-step event grammar (orchestrator_core.event_order)."""

from __future__ import annotations

import pytest

from orchestrator_core.event_order import (
    BODY_TYPES,
    DROPPABLE_TYPES,
    TERMINAL_TYPES,
    EventOrder,
    EventOrderError,
    EventType,
)

E = EventType
BODY = [E.TOKEN, E.TOOL_SUGGEST, E.FACT, E.METRICS, E.NARRATION, E.ESCALATION]
TERMINALS = [E.END, E.ERROR]


def feed(events: list[EventType]) -> tuple[EventOrder, list[int]]:
    order = EventOrder()
    return order, [order.accept(e) for e in events]


def _name(events: list[EventType]) -> str:
    return ",".join(e.value for e in events) or "<empty>"


def test_type_sets() -> None:
    assert set(BODY) == BODY_TYPES
    assert set(TERMINALS) == TERMINAL_TYPES
    assert {E.METRICS, E.NARRATION} == DROPPABLE_TYPES
    assert DROPPABLE_TYPES <= BODY_TYPES
    assert not (BODY_TYPES & TERMINAL_TYPES)
    assert E.STARTED not in BODY_TYPES | TERMINAL_TYPES
    assert E.CHECKPOINT not in BODY_TYPES | TERMINAL_TYPES


LEGAL = [
    [E.STARTED, E.END],
    [E.STARTED, E.ERROR],
    [E.STARTED, E.CHECKPOINT, E.END],
    [E.STARTED, E.CHECKPOINT, E.ERROR],
    [E.STARTED, E.TOKEN, E.END],
    [E.STARTED, E.TOKEN, E.TOKEN, E.TOKEN, E.END],
    [E.STARTED, *BODY, E.END],
    [E.STARTED, *BODY, *BODY, E.CHECKPOINT, E.END],
    [E.STARTED, E.FACT, E.CHECKPOINT, E.ERROR],
    [E.STARTED, E.METRICS, E.NARRATION, E.ESCALATION, E.ERROR],
    [E.STARTED, E.TOOL_SUGGEST, E.CHECKPOINT, E.END],
    [E.STARTED, *([E.TOKEN] * 100), E.END],
]


@pytest.mark.parametrize("events", LEGAL, ids=[_name(e) for e in LEGAL])
def test_legal_sequences_numbered_from_zero_gap_free(events: list[EventType]) -> None:
    order, seqs = feed(events)
    assert seqs == list(range(len(events)))
    assert order.next_seq == len(events)
    assert order.closed


@pytest.mark.parametrize("body", BODY, ids=lambda e: e.value)
@pytest.mark.parametrize("terminal", TERMINALS, ids=lambda e: e.value)
def test_each_body_type_then_each_terminal(body: EventType, terminal: EventType) -> None:
    order, seqs = feed([E.STARTED, body, body, terminal])
    assert seqs == [0, 1, 2, 3]
    assert order.closed


def test_fresh_order() -> None:
    order = EventOrder()
    assert order.next_seq == 0
    assert not order.closed


def test_open_until_terminal() -> None:
    order = EventOrder()
    for e in [E.STARTED, E.TOKEN, E.CHECKPOINT]:
        order.accept(e)
        assert not order.closed
    order.accept(E.END)
    assert order.closed


ILLEGAL = [
    # nothing before started
    [E.TOKEN],
    [E.END],
    [E.ERROR],
    [E.CHECKPOINT],
    [E.FACT],
    [E.METRICS],
    [E.NARRATION],
    [E.ESCALATION],
    [E.TOOL_SUGGEST],
    # started only first, once
    [E.STARTED, E.STARTED],
    [E.STARTED, E.TOKEN, E.STARTED],
    [E.STARTED, E.CHECKPOINT, E.STARTED],
    # at most one checkpoint
    [E.STARTED, E.CHECKPOINT, E.CHECKPOINT],
    [E.STARTED, E.TOKEN, E.CHECKPOINT, E.CHECKPOINT],
    # no body after the checkpoint
    [E.STARTED, E.CHECKPOINT, E.TOKEN],
    [E.STARTED, E.CHECKPOINT, E.FACT],
    [E.STARTED, E.CHECKPOINT, E.METRICS],
    [E.STARTED, E.CHECKPOINT, E.NARRATION],
    [E.STARTED, E.CHECKPOINT, E.ESCALATION],
    [E.STARTED, E.CHECKPOINT, E.TOOL_SUGGEST],
    # nothing after the terminal
    [E.STARTED, E.END, E.TOKEN],
    [E.STARTED, E.END, E.END],
    [E.STARTED, E.END, E.ERROR],
    [E.STARTED, E.ERROR, E.END],
    [E.STARTED, E.ERROR, E.ERROR],
    [E.STARTED, E.END, E.STARTED],
    [E.STARTED, E.END, E.CHECKPOINT],
    [E.STARTED, E.ERROR, E.CHECKPOINT],
    [E.STARTED, E.TOKEN, E.END, E.METRICS],
    [E.STARTED, E.CHECKPOINT, E.END, E.NARRATION],
]


@pytest.mark.parametrize("events", ILLEGAL, ids=[_name(e) for e in ILLEGAL])
def test_illegal_sequences_refused_at_the_last_event(events: list[EventType]) -> None:
    *prefix, last = events
    order, seqs = feed(prefix)
    assert seqs == list(range(len(prefix)))
    closed_before = order.closed
    with pytest.raises(EventOrderError):
        order.accept(last)
    # A refused event takes no seq and does not change the phase.
    assert order.next_seq == len(prefix)
    assert order.closed is closed_before


@pytest.mark.parametrize("event", [e for e in EventType if e is not E.STARTED])
def test_every_type_but_started_refused_first(event: EventType) -> None:
    with pytest.raises(EventOrderError, match="before started"):
        EventOrder().accept(event)


@pytest.mark.parametrize("event", list(EventType), ids=lambda e: e.value)
@pytest.mark.parametrize("terminal", TERMINALS, ids=lambda e: e.value)
def test_every_type_refused_after_terminal(event: EventType, terminal: EventType) -> None:
    order, _ = feed([E.STARTED, E.TOKEN, terminal])
    with pytest.raises(EventOrderError, match="after the terminal"):
        order.accept(event)
    assert order.next_seq == 3


def test_refused_event_leaves_order_usable() -> None:
    order = EventOrder()
    assert order.accept(E.STARTED) == 0
    assert order.accept(E.TOKEN) == 1
    with pytest.raises(EventOrderError):
        order.accept(E.STARTED)
    assert order.accept(E.TOKEN) == 2
    assert order.accept(E.CHECKPOINT) == 3
    with pytest.raises(EventOrderError):
        order.accept(E.TOKEN)
    with pytest.raises(EventOrderError):
        order.accept(E.CHECKPOINT)
    assert order.accept(E.END) == 4
    assert order.closed


def test_error_is_a_subclass_of_runtime_error() -> None:
    assert issubclass(EventOrderError, RuntimeError)


def test_orders_are_independent() -> None:
    a, b = EventOrder(), EventOrder()
    a.accept(E.STARTED)
    a.accept(E.TOKEN)
    assert b.accept(E.STARTED) == 0
    assert a.accept(E.END) == 2
    assert not b.closed
