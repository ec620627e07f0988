"""One async interface to inference engines, one module per engine protocol."""

from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable

__all__ = [
    "AdapterError",
    "AdapterEvent",
    "Capabilities",
    "EngineFailure",
    "EngineUnavailable",
    "Finish",
    "GenerationRequest",
    "Health",
    "Token",
    "WorkerAdapter",
]
