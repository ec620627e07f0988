"""The streaming gRPC calls an adapter has in flight, and which of them ``cancel()`` cut.

A call cancelled for its request (the step's cancel) ends its stream quietly, as every
adapter's does; a cancellation of the task itself (the step's execution torn down) still
propagates. The session adapters (kakeya, salience) and the Evergreen adapter keep theirs
here.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CallsInFlight:
    def __init__(self) -> None:
        self._calls: dict[str, Any] = {}  # by request id
        self._cancelled: set[str] = set()

    def hold(self, request_id: str, call: Any) -> None:
        self._calls[request_id] = call

    def release(self, request_id: str) -> None:
        """The call ended (its ``cancel()`` mark stays until :meth:`forget`)."""
        self._calls.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """The request is over: nothing of it is kept."""
        self._cancelled.discard(request_id)

    def cancel(self, request_id: str) -> None:
        call = self._calls.get(request_id)
        if call is not None:
            self._cancelled.add(request_id)
            call.cancel()

    def cancelled_by_request(self, request_id: str) -> bool:
        """The CancelledError being handled came from :meth:`cancel` (the call was cancelled
        for ``request_id``), not from a cancellation of the task itself."""
        task = asyncio.current_task()
        return request_id in self._cancelled and task is not None and not task.cancelling()

    def cancel_all(self) -> None:
        for call in list(self._calls.values()):
            call.cancel()
