"""Circuit breakers as state machines, on a frozen clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator_core import clock
from orchestrator_core.breakers import (
    BreakerBoard,
    BreakerConfig,
    BreakerState,
    CircuitBreaker,
    Transition,
)
from orchestrator_core.errors import CircuitOpen


@pytest.fixture(autouse=True)
def frozen() -> Iterator[clock.FrozenClock]:
    fake = clock.FrozenClock(datetime(2026, 1, 1, tzinfo=UTC))
    previous = clock.set_clock(fake)
    try:
        yield fake
    finally:
        clock.set_clock(previous)


def breaker(threshold: int = 3, open_s: float = 10.0, trials: int = 1) -> CircuitBreaker:
    return CircuitBreaker("http:x", BreakerConfig(threshold, open_s, trials))


def state_of(b: CircuitBreaker) -> BreakerState:
    # read through a call: mypy would keep an earlier assert's narrowing of the property
    return b.state


def fail(b: CircuitBreaker, n: int = 1) -> list[Transition | None]:
    return [b.before_call().failure("boom") for _ in range(n)]


def open_breaker(threshold: int = 1, trials: int = 1) -> CircuitBreaker:
    b = breaker(threshold=threshold, trials=trials)
    fail(b, threshold)
    assert state_of(b) is BreakerState.OPEN
    return b


def test_full_cycle(frozen: clock.FrozenClock) -> None:
    b = breaker()
    assert fail(b, 2) == [None, None]
    assert state_of(b) is BreakerState.CLOSED
    assert b.retry_after_ms() == 0
    opened = b.before_call().failure("boom")
    assert opened == Transition(
        "http:x", BreakerState.OPEN, BreakerState.CLOSED, 3, "3 consecutive failures, last: boom"
    )
    assert opened.as_event() == {
        "target": "http:x",
        "state": "open",
        "failures": 3,
        "reason": "3 consecutive failures, last: boom",
    }

    frozen.advance(4)
    with pytest.raises(CircuitOpen) as info:
        b.before_call()
    assert info.value.retry_after_ms == 6000
    assert info.value.body()["code"] == "CIRCUIT_OPEN"
    assert info.value.body()["retriable"] is True
    assert info.value.details == {"target": "http:x", "state": "open"}

    frozen.advance(6)
    assert state_of(b) is BreakerState.OPEN  # it half-opens when a call asks
    assert b.retry_after_ms() == 0
    trial = b.before_call()
    assert trial.trial
    assert trial.transition is not None
    assert trial.transition.state is BreakerState.HALF_OPEN
    assert trial.transition.previous is BreakerState.OPEN
    assert state_of(b) is BreakerState.HALF_OPEN
    with pytest.raises(CircuitOpen):  # one trial at a time
        b.before_call()
    reopened = trial.failure("still down")
    assert reopened is not None
    assert (reopened.state, reopened.previous) == (BreakerState.OPEN, BreakerState.HALF_OPEN)
    assert reopened.reason == "a trial call failed: still down"
    with pytest.raises(CircuitOpen) as info:
        b.before_call()
    assert info.value.retry_after_ms == 10000

    frozen.advance(10)
    trial = b.before_call()
    closed = trial.success()
    assert closed is not None
    assert (closed.state, closed.previous) == (BreakerState.CLOSED, BreakerState.HALF_OPEN)
    assert closed.as_event()["failures"] == 0
    assert b.failures == 0
    normal = b.before_call()
    assert not normal.trial and normal.transition is None
    assert normal.success() is None


def test_retry_after_is_at_least_one_ms(frozen: clock.FrozenClock) -> None:
    b = open_breaker()
    frozen.advance(10 - 1e-5)
    with pytest.raises(CircuitOpen) as info:
        b.before_call()
    assert info.value.retry_after_ms == 1


def test_a_success_resets_the_count() -> None:
    b = breaker(threshold=2)
    fail(b)
    assert b.failures == 1
    assert b.before_call().success() is None
    assert b.failures == 0
    assert fail(b) == [None]
    assert state_of(b) is BreakerState.CLOSED


def test_results_of_calls_begun_before_a_change_do_not_count(frozen: clock.FrozenClock) -> None:
    b = breaker(threshold=1)
    early, other = b.before_call(), b.before_call()
    fail(b)
    assert early.success() is None  # a late success does not close it
    assert state_of(b) is BreakerState.OPEN
    assert other.failure("late") is None
    assert b.failures == 1
    frozen.advance(10)
    trial = b.before_call()
    assert early.failure("late") is None  # already ended
    assert state_of(b) is BreakerState.HALF_OPEN
    closed = trial.success()
    assert closed is not None and closed.state is BreakerState.CLOSED


def test_a_permit_ends_once() -> None:
    b = breaker(threshold=2)
    permit = b.before_call()
    assert permit.failure("a") is None
    assert permit.failure("a") is None
    assert permit.success() is None
    assert b.failures == 1


@pytest.mark.parametrize("trials", [1, 3])
def test_half_open_allows_the_configured_trials(frozen: clock.FrozenClock, trials: int) -> None:
    b = open_breaker(trials=trials)
    frozen.advance(10)
    permits = [b.before_call() for _ in range(trials)]
    with pytest.raises(CircuitOpen):
        b.before_call()
    assert permits[0].transition is not None
    assert all(p.transition is None for p in permits[1:])
    assert all(p.trial for p in permits)
    assert permits[-1].success() is not None
    assert all(p.success() is None for p in permits[:-1])  # decided already
    assert state_of(b) is BreakerState.CLOSED


def test_a_released_trial_frees_its_slot(frozen: clock.FrozenClock) -> None:
    b = open_breaker()
    frozen.advance(10)
    b.before_call().release()
    assert state_of(b) is BreakerState.HALF_OPEN
    trial = b.before_call()
    assert trial.transition is None
    trial.release()
    trial.release()  # once only
    b.before_call()
    with pytest.raises(CircuitOpen):
        b.before_call()


def test_a_silent_trial_is_presumed_lost_after_open_s(frozen: clock.FrozenClock) -> None:
    b = open_breaker()
    frozen.advance(10)
    lost = b.before_call()
    frozen.advance(4)
    with pytest.raises(CircuitOpen) as info:
        b.before_call()
    assert info.value.retry_after_ms == 6000
    frozen.advance(6)
    second = b.before_call()
    assert second.transition is None
    with pytest.raises(CircuitOpen):
        b.before_call()
    closed = lost.success()  # a late answer from the target still counts as a trial's
    assert closed is not None and closed.state is BreakerState.CLOSED
    assert second.failure("late") is None


def test_releasing_a_trial_presumed_lost_frees_no_slot(frozen: clock.FrozenClock) -> None:
    b = open_breaker()
    frozen.advance(10)
    lost = b.before_call()
    frozen.advance(10)
    b.before_call()
    lost.release()  # its slot was given again already
    with pytest.raises(CircuitOpen):
        b.before_call()


def test_release_outside_half_open_changes_nothing() -> None:
    b = breaker(threshold=2)
    fail(b)
    b.before_call().release()
    assert (state_of(b), b.failures) == (BreakerState.CLOSED, 1)


@pytest.mark.parametrize(
    "config",
    [
        {"failure_threshold": 0},
        {"open_s": 0},
        {"open_s": float("nan")},
        {"half_open_max_calls": 0},
    ],
)
def test_config_is_checked(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="invalid breaker config"):
        BreakerConfig(**config)


def test_board_keeps_one_breaker_per_target() -> None:
    board = BreakerBoard(BreakerConfig(failure_threshold=1))
    assert board.get("a") is board.get("a")
    assert board.get("a").config == board.config
    board.get("a").before_call().failure("x")
    board.get("b")
    assert board.snapshot() == {"a": "open", "b": "closed"}


def test_board_drops_idle_breakers_as_it_grows() -> None:
    board = BreakerBoard(BreakerConfig(failure_threshold=2), idle_limit=4)
    board.get("fail").before_call().failure("x")
    board.get("open").before_call().failure("x")
    board.get("open").before_call().failure("x")
    kept = board.get("idle")
    board.get("idle2")
    assert len(board.snapshot()) == 4
    board.get("new")  # the fifth: idle ones go first
    assert board.snapshot() == {"fail": "closed", "new": "closed", "open": "open"}
    assert board.get("idle") is not kept
    assert board.get("open").state is BreakerState.OPEN
