"""How much one validation may cost, and where it runs.

A check runs under a deadline (:func:`deadline`): the validator looks at the clock at every
applicator keyword (``validator.py``) and gives up with :class:`ValidationTimeout`, which the
caller turns into a 413 naming ``validation.deadline_s``. Regex matching is one C call that
the clock cannot interrupt, so each match is bounded before it starts: a string of ``n``
characters against a pattern of ``p`` RE2 instructions costs up to ``n * p`` work units,
each about :data:`NS_PER_REGEX_UNIT` nanoseconds at worst (measured: a counting pattern such
as ``[ab]*a[ab]{14}c`` over random text, where RE2's DFA cannot keep its states), so the
units one match may take are what fits in the deadline.

Where a check runs: a cheap one (``work`` at most ``inline_max_work``) runs where it is
asked, on the event loop; a costly one, asked inside :func:`deferring`, raises
:class:`ValidationDeferred` instead, so that the server can run it on a worker thread,
outside its write transaction, and ask again with the check marked done
(``orchestratord/validation.py``). ``work`` is reckoned by ``cost.py``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from orchestrator_core import clock
from orchestrator_core.errors import TooLarge

T = TypeVar("T")

# measured worst case of RE2 per program instruction per character (see the module docstring)
NS_PER_REGEX_UNIT = 60


@dataclass(frozen=True)
class ValidationBound:
    """The settings ``validation.*`` as the validator uses them."""

    deadline_s: float = 2.0
    max_errors: int = 100
    inline_max_work: int = 2_000

    @property
    def regex_units(self) -> float:
        """Work units one regex match may take: what fits in the deadline at worst."""
        return self.deadline_s * 1e9 / NS_PER_REGEX_UNIT


_bound = ValidationBound()


def configure(bound: ValidationBound) -> None:
    """Set the process's bound (once, from settings, when the server starts)."""
    global _bound
    _bound = bound


def current() -> ValidationBound:
    return _bound


class ValidationTimeout(Exception):
    """The check passed its deadline (not an answer: callers raise ``TooLarge`` naming the
    field they check)."""


class ValidationDeferred(Exception):
    """A costly check asked for where it may run elsewhere: call :meth:`run` off the event
    loop, then ask again inside :func:`deferring` with ``(key, instance, result)`` done."""

    def __init__(self, key: bytes, instance: Any, check: Callable[[], Any], seconds: float) -> None:
        super().__init__("a costly check, to run off the event loop")
        self.key = key
        self.instance = instance
        self._check = check
        self._seconds = seconds

    def run(self) -> Any:
        """The check under its deadline: its result, or what it raises."""
        with deadline(self._seconds):
            return self._check()


Done = tuple[bytes, Any, Any]  # (key, instance, result) of a check run off the loop


_deadline: ContextVar[float] = ContextVar("validation_deadline", default=math.inf)
_may_defer: ContextVar[bool] = ContextVar("validation_may_defer", default=False)
_done: ContextVar[tuple[Done, ...]] = ContextVar("validation_done", default=())


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Checks made inside give up ``seconds`` from now (a deadline already nearer stays)."""
    at = min(_deadline.get(), clock.monotonic() + seconds)
    token = _deadline.set(at)
    try:
        yield
    finally:
        _deadline.reset(token)


def check_deadline() -> None:
    if clock.monotonic() > _deadline.get():
        raise ValidationTimeout


@contextlib.contextmanager
def deferring(done: tuple[Done, ...] = ()) -> Iterator[None]:
    """Costly checks asked inside raise :class:`ValidationDeferred`; one in ``done`` (same key,
    an equal value) answers with its result without running again."""
    may, was = _may_defer.set(True), _done.set(done)
    try:
        yield
    finally:
        _may_defer.reset(may)
        _done.reset(was)


def bounded_call(
    key: bytes,
    instance: Any,
    work: Callable[[], float],
    check: Callable[[], T],
    *,
    seconds: float | None = None,
) -> T:
    """``check()`` run here under the deadline (``seconds``, else ``validation.deadline_s``);
    or its result from a run off the loop; or, when it is costly and may run elsewhere,
    :class:`ValidationDeferred`."""
    seconds = _bound.deadline_s if seconds is None else seconds
    if _may_defer.get():
        for done_key, done_instance, result in _done.get():
            if done_key == key and (done_instance is instance or done_instance == instance):
                return cast(T, result)
        if work() > _bound.inline_max_work:
            raise ValidationDeferred(key, instance, check, seconds)
    with deadline(seconds):
        return check()


def timed_out(field: str) -> TooLarge:
    """The answer to a check of ``field`` that met its deadline."""
    seconds = _bound.deadline_s
    return TooLarge(
        f"checking it against its schema took longer than {seconds:g} s (validation.deadline_s)",
        limit="validation.deadline_s",
        value=max(1, round(seconds)),
        field=field,
    )
