"""Engine-side sessions owned by a run, for the session-bound protocols (Kakeya, Salience).

A run's :class:`~worker_adapters.session_handle.EngineSession` records the engine's session,
every token id the engine was given or generated, and the length the engine is believed to
hold. Adapters check that length against what the engine reports on every call, repair a
mismatch by recreating the session from the record, and raise :class:`SessionDrift` when they
cannot: the two sides never diverge unnoticed. The prompt is tokenized on the control-plane
side (``worker_adapters.tokenizers``).

Errors (all :class:`~worker_adapters.errors.AdapterError`, retriable):

SessionLost    the engine no longer knows the session and it could not be recreated here
SessionDrift   the engine holds another history than the record, and repairing failed

A generation ends with a :class:`SessionFinish`: a :class:`~worker_adapters.base.Finish` that
tells the engine's own stop reason, the tokens its truncation dropped, and how long the
session is afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker_adapters.base import Finish
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable


class SessionLost(AdapterError):
    """The engine answered NOT_FOUND for the session; its record allows recreating it."""

    retriable = True


class SessionDrift(AdapterError):
    """The engine's history differs from the record and could not be repaired."""

    retriable = True

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        super().__init__(f"{message} (expected {expected} tokens, engine holds {actual})")
        self.expected = expected
        self.actual = actual


# gRPC status names -> the project's errors; see docs/engines-sessions.md.
_RETRIABLE = frozenset(
    {"FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "ABORTED", "DEADLINE_EXCEEDED", "CANCELLED"}
)


def error_for_status(code: str, detail: str, *, engine: str) -> AdapterError:
    """The project's error for an engine's gRPC status (by name: no gRPC types here)."""
    message = f"{engine} answered {code}: {detail}"
    if code == "NOT_FOUND":
        return SessionLost(message)
    if code == "UNAVAILABLE":
        return EngineUnavailable(message)
    if code in _RETRIABLE:
        return AdapterError(message, retriable=True)
    return EngineFailure(message)


@dataclass(frozen=True, slots=True)
class SessionFinish(Finish):
    engine_reason: str = ""  # the engine's stop reason as named by its protocol
    truncated: int = 0  # tokens the engine dropped from the session before this generation
    session_length: int = 0  # tokens the engine holds after this generation


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
