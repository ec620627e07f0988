"""Errors an adapter may raise; an engine library's own exceptions never leave its module.

AdapterError            retriable flag; the orchestrator maps it to ENGINE_ERROR
├── EngineUnavailable   the engine cannot be reached (POOL_UNAVAILABLE, retriable)
└── EngineFailure       the engine answered with an error or broke the protocol
    └── EngineOverLimit the engine sent more, or was slower, than a limit allows (``reason``
                        and ``limit``, the setting, shown in the error's details)

``retry_after_ms``: how long the engine asked to be left alone (its ``Retry-After``), if it did.
"""

from __future__ import annotations


class AdapterError(Exception):
    retriable = False

    def __init__(
        self, message: str, *, retriable: bool | None = None, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if retriable is not None:
            self.retriable = retriable
        self.retry_after_ms = retry_after_ms


class EngineUnavailable(AdapterError):
    retriable = True


class EngineFailure(AdapterError):
    pass


class EngineOverLimit(EngineFailure):
    """A limit on what an engine may send ended the call: ``reason`` says which
    (``token_too_large``, ``output_too_large``, ``engine_idle``, ``step_deadline``), ``limit``
    names the setting."""

    def __init__(self, message: str, *, reason: str, limit: str, retriable: bool) -> None:
        super().__init__(message, retriable=retriable)
        self.reason = reason
        self.limit = limit
