"""The Python SDK of orchestratord: :class:`AsyncClient` and :class:`Client` (every route,
typed with the contract's models, streams that resume, retries), the step builders in
:mod:`orchestrator_client.steps`, and the ``orchctl`` CLI.

It imports only ``contracts`` and httpx, so it installs and runs without the server."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("orchestratord")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

from orchestrator_client.calls import new_token
from orchestrator_client.client import AsyncClient, Client
from orchestrator_client.errors import (
    ApiError,
    ClientError,
    Conflict,
    Invalid,
    InvalidParams,
    InvalidRequest,
    NotFound,
    StepFailed,
    Unavailable,
    Unreachable,
)
from orchestrator_client.transport import Retry

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "ClientError",
    "Conflict",
    "Invalid",
    "InvalidParams",
    "InvalidRequest",
    "NotFound",
    "Retry",
    "StepFailed",
    "Unavailable",
    "Unreachable",
    "__version__",
    "new_token",
]
