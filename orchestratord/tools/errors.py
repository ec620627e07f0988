"""The one error a tool executor raises; httpx's errors never leave ``tools/http.py``."""

from __future__ import annotations

from typing import Any, Literal

FailureReason = Literal["timeout", "status", "invalid_json", "too_large", "connect", "builtin"]


class ToolFailure(Exception):
    def __init__(
        self,
        reason: FailureReason,
        message: str,
        *,
        status: int | None = None,
        attempts: int = 1,
        retriable: bool = False,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.status = status
        self.attempts = attempts
        self.retriable = retriable

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason, "attempts": self.attempts}
        if self.status is not None:
            out["status"] = self.status
        return out
