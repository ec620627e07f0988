"""What an engine step allows its engine, whatever the protocol (``engine_limits`` settings).

- bytes: one token at most ``max_token_bytes``, the step's text at most ``max_output_bytes``
  (UTF-8); the token that would pass either is not stored, and the step fails
  (:class:`OutputMeter`). Adapters that read bytes also stop reading a stream line that could
  only hold a larger token, so it is never buffered whole (``worker_adapters.openai``).
- time: an engine that sends no token for ``idle_timeout_s`` (keep-alives or not), and a step
  that no ``max_wall_ms`` bounds running past ``step_deadline_s``, end the call
  (:func:`watchdog`); the engine's slot is let go as a cancel lets it go.
- a busy engine: an answer 429 or 503 with ``Retry-After`` before anything streamed is asked
  again after the wait it asked, ``busy_retries`` times at most and only while the wait ends
  before the step's deadline (:func:`busy_wait_s`); else its error carries ``retry_after_ms``.

Each ending is an :class:`~worker_adapters.errors.EngineOverLimit`, shown as ``ENGINE_ERROR``
with ``details.reason`` and ``details.limit``. Retriable or not, by whether the same request
can end otherwise: a stalled engine (``engine_idle``) may answer the next time, or another
replica may (and, like a timeout, it counts against the replica's breaker); a token or an
output too large comes again for the same request and seed, and a step cut at the default
deadline is cut again unless its budget's ``max_wall_ms`` asks for longer (not retriable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from orchestrator_core import clock
from orchestratord.settings import EngineLimitSettings
from worker_adapters.errors import EngineOverLimit


def utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class OutputMeter:
    """Counts a step's output bytes as tokens arrive; refuses the token past a limit."""

    def __init__(self, limits: EngineLimitSettings) -> None:
        self.max_token_bytes = limits.max_token_bytes
        self.max_output_bytes = limits.max_output_bytes
        self.total = 0

    def take(self, text: str) -> None:
        """Count ``text``, or raise :class:`EngineOverLimit` (and count nothing)."""
        size = utf8_len(text)
        if size > self.max_token_bytes:
            raise EngineOverLimit(
                f"the engine sent a token of {size} bytes, over engine_limits.max_token_bytes"
                f" ({self.max_token_bytes}); it was not stored",
                reason="token_too_large",
                limit="engine_limits.max_token_bytes",
                retriable=False,
            )
        if self.total + size > self.max_output_bytes:
            raise EngineOverLimit(
                f"the step's output would pass engine_limits.max_output_bytes"
                f" ({self.max_output_bytes} bytes); the text before it was kept",
                reason="output_too_large",
                limit="engine_limits.max_output_bytes",
                retriable=False,
            )
        self.total += size


def idle_error(limits: EngineLimitSettings) -> EngineOverLimit:
    return EngineOverLimit(
        f"the engine sent no token for {limits.idle_timeout_s:g} s"
        " (engine_limits.idle_timeout_s); the call was ended",
        reason="engine_idle",
        limit="engine_limits.idle_timeout_s",
        retriable=True,
    )


def deadline_error(limits: EngineLimitSettings) -> EngineOverLimit:
    return EngineOverLimit(
        f"the step ran for {limits.step_deadline_s:g} s, the deadline of a step with no"
        " max_wall_ms (engine_limits.step_deadline_s); give its budget a max_wall_ms to allow"
        " longer",
        reason="step_deadline",
        limit="engine_limits.step_deadline_s",
        retriable=False,
    )


async def watchdog(
    asked_at: Callable[[], float], limits: EngineLimitSettings, deadline_at: float | None
) -> EngineOverLimit:
    """Return the error that ends the call once the engine has been asked for its next token
    (``asked_at``, monotonic, read on each wake; inf while the step waits for its readers)
    for ``idle_timeout_s``, or ``deadline_at`` (monotonic; None: no default deadline) has
    come. It sleeps until the earlier of the two and looks again, so a token costs the
    caller one float, not a timer."""
    while True:
        now = clock.clock.monotonic()
        if deadline_at is not None and now >= deadline_at:
            return deadline_error(limits)
        idle_at = asked_at() + limits.idle_timeout_s
        if now >= idle_at:
            return idle_error(limits)
        wake = idle_at if deadline_at is None else min(idle_at, deadline_at)
        # asked_at is inf while the step waits for its readers: look again after a while
        await asyncio.sleep(min(wake - now, limits.idle_timeout_s))


def busy_wait_s(
    retry_after_ms: int | None, *, streamed: bool, elapsed_s: float, deadline_s: float
) -> float | None:
    """Seconds to wait before asking again an engine that asked for ``retry_after_ms`` (its
    ``Retry-After``; None: it did not): that wait, when nothing has streamed and it ends
    before ``deadline_s`` (the step's, from its start); else None (the error stands, with its
    ``retry_after_ms``)."""
    if retry_after_ms is None or streamed:
        return None
    wait_s = retry_after_ms / 1000
    return wait_s if elapsed_s + wait_s < deadline_s else None
