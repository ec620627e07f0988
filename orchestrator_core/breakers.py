"""Circuit breakers: closed -> open -> half-open -> closed, as small state machines.

Closed, a breaker counts consecutive failures; at ``failure_threshold`` it opens. Open,
calls fail fast with ``CircuitOpen`` (retriable, ``retry_after_ms`` until half-open). After
``open_s`` the next call half-opens it and ``half_open_max_calls`` trial calls go through:
a trial's success closes it, a trial's failure opens it again. Every change of state is
returned as a ``Transition``, which the caller turns into an ``escalation`` event.

A call asks ``before_call()`` for a ``Permit`` and ends it once, through the permit:
``success()``, ``failure(reason)``, or ``release()`` when it ended with no verdict on the
target (cancelled before an answer). A permit remembers the breaker's generation, bumped on
every change of state: a call that began before the breaker opened and ends after cannot
close it (only a trial can), nor count twice. A trial that never reports is presumed lost
after ``open_s``, and another trial goes through, so a dropped permit cannot hold a breaker
half-open forever.

The state moves only when a call asks or reports: a breaker whose ``open_s`` has passed
still reads ``open`` until the next ``before_call()`` half-opens it (that call's permit
carries the ``Transition``).

State lives in this process, in memory, and is not shared: with several processes each
learns a dead target from its own calls (at most ``failure_threshold`` failed calls each),
which is cheaper than a shared write on every call. Breakers are used from one event loop
and never await, so they need no locks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from orchestrator_core import clock
from orchestrator_core.errors import CircuitOpen


@dataclass(frozen=True)
class BreakerConfig:
    """``failure_threshold`` consecutive failures open a breaker; ``open_s`` seconds later
    ``half_open_max_calls`` trial calls go through (a silent trial holds its slot as long)."""

    failure_threshold: int = 5
    open_s: float = 30.0
    half_open_max_calls: int = 1

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.half_open_max_calls < 1 or not self.open_s > 0:
            raise ValueError(f"invalid breaker config: {self}")


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class Transition:
    """A breaker's change of state, and why."""

    target: str
    state: BreakerState
    previous: BreakerState
    failures: int
    reason: str

    def as_event(self) -> dict[str, Any]:
        """The body of the ``escalation`` event."""
        return {
            "target": self.target,
            "state": self.state.value,
            "failures": self.failures,
            "reason": self.reason,
        }


class Permit:
    """One call's leave to go ahead, ended once by ``success``, ``failure`` or ``release``
    (later ends are ignored). ``transition`` is set when giving it half-opened the breaker;
    ``trial`` says whether its result decides a half-open breaker."""

    __slots__ = ("_breaker", "_done", "_generation", "_round", "transition", "trial")

    def __init__(
        self,
        breaker: CircuitBreaker,
        generation: int,
        round_: int,
        trial: bool,
        transition: Transition | None,
    ) -> None:
        self._breaker = breaker
        self._generation = generation
        self._round = round_
        self._done = False
        self.trial = trial
        self.transition = transition

    def success(self) -> Transition | None:
        """The target answered: resets the failure count, closes a half-open breaker."""
        if self._done:
            return None
        self._done = True
        return self._breaker._on_success(self._generation)

    def failure(self, reason: str) -> Transition | None:
        """The target failed; the returned ``Transition`` is set when this opened it."""
        if self._done:
            return None
        self._done = True
        return self._breaker._on_failure(self._generation, reason)

    def release(self) -> None:
        """The call ended saying nothing about the target: free its trial slot, if any."""
        if self._done:
            return
        self._done = True
        if self.trial:
            self._breaker._on_release(self._generation, self._round)


class CircuitBreaker:
    """The breaker of one target (a tool endpoint, an engine replica)."""

    def __init__(self, target: str, config: BreakerConfig) -> None:
        self.target = target
        self.config = config
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._generation = 0  # bumped on every change of state
        self._opened_at = 0.0
        self._trials = 0  # trial permits given in the current round
        self._round = 0  # bumped when silent trials are presumed lost
        self._round_at = 0.0

    @property
    def state(self) -> BreakerState:
        return self._state

    @property
    def failures(self) -> int:
        """Consecutive failures so far."""
        return self._failures

    @property
    def idle(self) -> bool:
        """Closed with nothing counted: no different from a new breaker."""
        return self._state is BreakerState.CLOSED and self._failures == 0

    def retry_after_ms(self) -> int:
        """Milliseconds until ``before_call()`` would give a permit; 0 if it would now."""
        if self._state is BreakerState.OPEN:
            until = self._opened_at + self.config.open_s
        elif self._state is BreakerState.HALF_OPEN and self._slots_full():
            until = self._round_at + self.config.open_s
        else:
            return 0
        left_ms = (until - clock.clock.monotonic()) * 1000
        # rounded first so that float noise (0.3 * 1000) does not add a millisecond
        return max(0, math.ceil(round(left_ms, 6)))

    def before_call(self) -> Permit:
        """A permit for one call, or ``CircuitOpen`` while calls must fail fast."""
        transition = None
        if self._state is BreakerState.OPEN:
            wait_ms = self.retry_after_ms()
            if wait_ms > 0:
                raise CircuitOpen(self.target, retry_after_ms=wait_ms)
            transition = self._move(
                BreakerState.HALF_OPEN, f"open for {self.config.open_s:g}s: trying"
            )
        if self._state is BreakerState.CLOSED:
            return Permit(self, self._generation, self._round, False, transition)
        if self._slots_full():
            wait_ms = self.retry_after_ms()
            if wait_ms > 0:
                raise CircuitOpen(self.target, retry_after_ms=wait_ms)
            self._new_round()  # the trials out there are presumed lost
        self._trials += 1
        return Permit(self, self._generation, self._round, True, transition)

    def _slots_full(self) -> bool:
        return self._trials >= self.config.half_open_max_calls

    def _new_round(self) -> None:
        self._round += 1
        self._trials = 0
        self._round_at = clock.clock.monotonic()

    def _move(self, state: BreakerState, reason: str) -> Transition:
        previous, self._state = self._state, state
        self._generation += 1
        if state is BreakerState.OPEN:
            self._opened_at = clock.clock.monotonic()
        elif state is BreakerState.HALF_OPEN:
            self._new_round()
        return Transition(self.target, state, previous, self._failures, reason)

    def _on_success(self, generation: int) -> Transition | None:
        if generation != self._generation:
            return None  # began in another state: its result says nothing about this one
        self._failures = 0
        if self._state is BreakerState.HALF_OPEN:
            return self._move(BreakerState.CLOSED, "a trial call succeeded")
        return None

    def _on_failure(self, generation: int, reason: str) -> Transition | None:
        if generation != self._generation:
            return None
        self._failures += 1
        if self._state is BreakerState.HALF_OPEN:
            return self._move(BreakerState.OPEN, f"a trial call failed: {reason}")
        if self._failures >= self.config.failure_threshold:
            return self._move(
                BreakerState.OPEN, f"{self._failures} consecutive failures, last: {reason}"
            )
        return None

    def _on_release(self, generation: int, round_: int) -> None:
        # a slot of an earlier round was already given again
        if generation == self._generation and round_ == self._round and self._trials > 0:
            self._trials -= 1


class BreakerBoard:
    """The breakers of one kind of target, created on first use.

    Idle breakers (closed, no failures counted) are dropped whenever the board reaches
    ``idle_limit`` breakers and again each time it doubles, so per-run targets do not
    accumulate. A call in flight on a dropped breaker reports to that object, which no
    longer counts: at worst one failure per such call goes uncounted.
    """

    def __init__(self, config: BreakerConfig, *, idle_limit: int = 1024) -> None:
        self.config = config
        self._breakers: dict[str, CircuitBreaker] = {}
        self._idle_limit = idle_limit
        self._sweep_at = idle_limit

    def get(self, target: str) -> CircuitBreaker:
        breaker = self._breakers.get(target)
        if breaker is None:
            if len(self._breakers) >= self._sweep_at:
                self._sweep()
            breaker = self._breakers[target] = CircuitBreaker(target, self.config)
        return breaker

    def is_open(self, target: str) -> bool:
        """``target``'s calls fail fast now (open, its wait not over); creates nothing."""
        breaker = self._breakers.get(target)
        return (
            breaker is not None
            and breaker.state is BreakerState.OPEN
            and breaker.retry_after_ms() > 0
        )

    def _sweep(self) -> None:
        self._breakers = {t: b for t, b in self._breakers.items() if not b.idle}
        # at least as many new targets as survivors before the next sweep: O(1) amortized
        self._sweep_at = max(self._idle_limit, 2 * len(self._breakers))

    def state_of(self, target: str) -> tuple[str, int]:
        """``target``'s state and consecutive failures; a target never met is closed, 0."""
        breaker = self._breakers.get(target)
        if breaker is None:
            return BreakerState.CLOSED.value, 0
        return breaker.state.value, breaker.failures

    def snapshot(self) -> dict[str, str]:
        """Each known target's state, by target."""
        return {t: b.state.value for t, b in sorted(self._breakers.items())}
