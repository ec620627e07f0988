"""Errors an adapter may raise; an engine library's own exceptions never leave its module.

AdapterError            retriable flag; the orchestrator maps it to ENGINE_ERROR
├── EngineUnavailable   the engine cannot be reached (POOL_UNAVAILABLE, retriable)
└── EngineFailure       the engine answered with an error or broke the protocol
"""

from __future__ import annotations


class AdapterError(Exception):
    retriable = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retriable is not None:
            self.retriable = retriable


class EngineUnavailable(AdapterError):
    retriable = True


class EngineFailure(AdapterError):
    pass
