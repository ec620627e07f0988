"""Circuit breakers: closed -> open -> half-open -> closed, as small state machines.

Closed, a breaker counts consecutive failures; at ``failure_threshold`` it opens. Open,
calls fail fast with ``CircuitOpen`` (retriable, ``retry_after_ms`` until half-open). After
``open_s`` it lets ``half_open_max_calls`` trial calls through: a trial's success closes it,
a trial's failure opens it again. Every change of state is returned as a ``Transition``,
which the caller turns into an ``escalation`` event.

A call asks ``before_call()`` for a ``Permit`` and reports through it. A permit remembers
the breaker's generation when it was given: a call that began before the breaker opened
and ends after cannot close it (only a trial can), nor count twice.

State lives in this process, in memory, and is not shared: with several processes each
learns a dead target from its own calls (at most ``failure_threshold`` failed calls each),
which is cheaper than a shared write on every call. Used from one event loop: no locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestrator_core import clock
from orchestrator_core.errors import CircuitOpen


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int = 5
    open_s: float = 30.0
    half_open_max_calls: int = 1


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class Transition:
    target: str
    state: BreakerState
    previous: BreakerState
    failures: int
    reason: str

    def as_event(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "state": self.state.value,
            "failures": self.failures,
            "reason": self.reason,
        }


class Permit:
    """One call's leave to go ahead; report its result once through ``success`` or
    ``failure``. ``transition`` is set when giving it half-opened the breaker."""

    __slots__ = ("_breaker", "_done", "_generation", "transition", "trial")

    def __init__(
        self,
        breaker: CircuitBreaker,
        generation: int,
        trial: bool,
        transition: Transition | None,
    ) -> None:
        self._breaker = breaker
        self._generation = generation
        self._done = False
        self.trial = trial
        self.transition = transition

    def success(self) -> Transition | None:
        if self._done:
            return None
        self._done = True
        return self._breaker._on_success(self)

    def failure(self, reason: str) -> Transition | None:
        if self._done:
            return None
        self._done = True
        return self._breaker._on_failure(self, reason)


class CircuitBreaker:
    def __init__(self, target: str, config: BreakerConfig) -> None:
        self.target = target
        self.config = config
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trials = 0
        self._generation = 0  # bumped on every change of state

    @property
    def state(self) -> BreakerState:
        return self._state

    @property
    def failures(self) -> int:
        return self._failures

    def retry_after_ms(self) -> int:
        left = self._opened_at + self.config.open_s - clock.clock.monotonic()
        return max(1, round(left * 1000))

    def before_call(self) -> Permit:
        """A permit for one call, or ``CircuitOpen`` while calls must fail fast."""
        transition = None
        if self._state is BreakerState.OPEN:
            if clock.clock.monotonic() - self._opened_at < self.config.open_s:
                raise CircuitOpen(self.target, retry_after_ms=self.retry_after_ms())
            transition = self._move(
                BreakerState.HALF_OPEN, f"open for {self.config.open_s:g}s: trying"
            )
            self._trials = 0
        if self._state is BreakerState.HALF_OPEN:
            if self._trials >= self.config.half_open_max_calls:
                raise CircuitOpen(
                    self.target, retry_after_ms=max(1, round(self.config.open_s * 1000))
                )
            self._trials += 1
            return Permit(self, self._generation, True, transition)
        return Permit(self, self._generation, False, transition)

    def _move(self, state: BreakerState, reason: str) -> Transition:
        previous, self._state = self._state, state
        self._generation += 1
        if state is BreakerState.OPEN:
            self._opened_at = clock.clock.monotonic()
        return Transition(self.target, state, previous, self._failures, reason)

    def _on_success(self, permit: Permit) -> Transition | None:
        if permit._generation != self._generation:
            return None  # began in another state: its result says nothing about this one
        if self._state is BreakerState.HALF_OPEN:
            self._failures = 0
            return self._move(BreakerState.CLOSED, "a trial call succeeded")
        self._failures = 0
        return None

    def _on_failure(self, permit: Permit, reason: str) -> Transition | None:
        if permit._generation != self._generation:
            return None
        self._failures += 1
        if self._state is BreakerState.HALF_OPEN:
            return self._move(BreakerState.OPEN, f"a trial call failed: {reason}")
        if self._failures >= self.config.failure_threshold:
            return self._move(
                BreakerState.OPEN, f"{self._failures} consecutive failures, last: {reason}"
            )
        return None


class BreakerBoard:
    """The breakers of one kind of target, created on first use."""

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, target: str) -> CircuitBreaker:
        breaker = self._breakers.get(target)
        if breaker is None:
            breaker = self._breakers[target] = CircuitBreaker(target, self.config)
        return breaker

    def snapshot(self) -> dict[str, str]:
        return {t: b.state.value for t, b in sorted(self._breakers.items())}
