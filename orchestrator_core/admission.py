"""Admission: bounded queues per priority, FIFO within a priority.

When a priority's queue is full, the deployment's policy decides: ``reject`` refuses the new
step (429 ``ADMISSION_REJECT``); ``drop-lru`` admits it and drops the step that has waited
longest in that queue, which ends with the error ``QUEUE_FULL_DROP_LRU``. Both are retriable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from orchestrator_core.errors import OrchestratorError

PRIORITY_RANK = {"interactive": 0, "batch": 1}
OnFull = Literal["reject", "drop-lru"]


class AdmissionReject(OrchestratorError):
    code = "ADMISSION_REJECT"
    retriable = True


class QueueFullDropLru(OrchestratorError):
    code = "QUEUE_FULL_DROP_LRU"
    retriable = True


@dataclass(frozen=True)
class AdmissionPolicy:
    capacity: dict[str, int]
    on_full: OnFull = "reject"
    retry_after_ms: int = 1000


Verdict = Literal["admit", "drop_oldest"]


def admit(policy: AdmissionPolicy, *, priority: str, queued: int) -> Verdict:
    """``admit``, ``drop_oldest`` (then admit), or :class:`AdmissionReject`."""
    capacity = policy.capacity[priority]
    if queued < capacity:
        return "admit"
    if policy.on_full == "drop-lru" and capacity > 0:
        return "drop_oldest"
    raise AdmissionReject(
        f"the {priority} queue is full ({queued} of {capacity} steps waiting)",
        details={"priority": priority, "queued": queued, "capacity": capacity},
        retry_after_ms=policy.retry_after_ms,
    )


def dropped_error(priority: str, capacity: int) -> QueueFullDropLru:
    return QueueFullDropLru(
        f"dropped from the full {priority} queue to admit a newer step",
        details={"priority": priority, "capacity": capacity},
        retry_after_ms=1000,
    )
