"""Circuit breakers as state machines, on a frozen clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from orchestrator_core import clock
from orchestrator_core.breakers import BreakerBoard, BreakerConfig, BreakerState, CircuitBreaker
from orchestrator_core.errors import CircuitOpen


@pytest.fixture
def frozen() -> Iterator[clock.FrozenClock]:
    fake = clock.FrozenClock(datetime(2026, 1, 1, tzinfo=UTC))
    previous = clock.set_clock(fake)
    try:
        yield fake
    finally:
        clock.set_clock(previous)


def breaker(threshold: int = 3, open_s: float = 10.0, trials: int = 1) -> CircuitBreaker:
    return CircuitBreaker("http:x", BreakerConfig(threshold, open_s, trials))


def fail(b: CircuitBreaker, n: int = 1) -> list[object]:
    return [b.before_call().failure("boom") for _ in range(n)]


def test_full_cycle(frozen: clock.FrozenClock) -> None:
    b = breaker()
    assert fail(b, 2) == [None, None]
    assert b.state is BreakerState.CLOSED
    opened = b.before_call().failure("boom")
    assert opened is not None
    assert opened.as_event() == {
        "target": "http:x",
        "state": "open",
        "failures": 3,
        "reason": "3 consecutive failures, last: boom",
    }
    assert opened.previous is BreakerState.CLOSED
    frozen.advance(4)
    with pytest.raises(CircuitOpen) as info:
        b.before_call()
    assert info.value.retry_after_ms == 6000
    assert info.value.retriable is True
    assert info.value.body()["code"] == "CIRCUIT_OPEN"
    frozen.advance(6)
    trial = b.before_call()
    assert trial.transition is not None and trial.transition.state is BreakerState.HALF_OPEN
    with pytest.raises(CircuitOpen):  # one trial at a time
        b.before_call()
    reopened = trial.failure("still down")
    assert reopened is not None and reopened.state is BreakerState.OPEN
    assert reopened.reason == "a trial call failed: still down"
    frozen.advance(10)
    trial = b.before_call()
    closed = trial.success()
    assert closed is not None and closed.state is BreakerState.CLOSED
    assert b.failures == 0
    assert b.before_call().success() is None


def test_a_success_resets_the_count() -> None:
    b = breaker(threshold=2)
    fail(b)
    b.before_call().success()
    fail(b)
    assert b.state is BreakerState.CLOSED


def test_results_of_calls_begun_before_a_change_do_not_count(frozen: clock.FrozenClock) -> None:
    b = breaker(threshold=1)
    early = b.before_call()
    fail(b)
    assert b.state is BreakerState.OPEN
    assert early.success() is None  # a late success does not close it
    assert b.state is BreakerState.OPEN
    frozen.advance(10)
    trial = b.before_call()
    assert early.failure("late") is None
    assert b.state is BreakerState.HALF_OPEN
    assert trial.success() is not None


def test_a_permit_reports_once() -> None:
    b = breaker(threshold=2)
    permit = b.before_call()
    permit.failure("a")
    permit.failure("a")
    assert b.failures == 1


@pytest.mark.parametrize("trials", [1, 3])
def test_half_open_allows_the_configured_trials(frozen: clock.FrozenClock, trials: int) -> None:
    b = breaker(threshold=1, trials=trials)
    fail(b)
    frozen.advance(10)
    permits = [b.before_call() for _ in range(trials)]
    with pytest.raises(CircuitOpen):
        b.before_call()
    assert permits[0].transition is not None
    assert all(p.transition is None for p in permits[1:])


def test_board_keeps_one_breaker_per_target() -> None:
    board = BreakerBoard(BreakerConfig(failure_threshold=1))
    assert board.get("a") is board.get("a")
    board.get("a").before_call().failure("x")
    board.get("b")
    assert board.snapshot() == {"a": "open", "b": "closed"}
