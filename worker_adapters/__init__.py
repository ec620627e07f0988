"""One async interface to inference engines, one module per engine protocol."""

# imported with the package: its logger exists before a service installs its log scrubbing
from worker_adapters import http1 as _http1  # noqa: F401
from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)
from worker_adapters.errors import (
    AdapterError,
    EngineFailure,
    EngineOverLimit,
    EngineUnavailable,
)

__all__ = [
    "AdapterError",
    "AdapterEvent",
    "Capabilities",
    "EngineFailure",
    "EngineOverLimit",
    "EngineUnavailable",
    "Finish",
    "GenerationRequest",
    "Health",
    "Token",
    "WorkerAdapter",
]
