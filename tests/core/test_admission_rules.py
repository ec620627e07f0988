"""Admission's rule alone (orchestrator_core.admission): a fixture builds the deployment's
policy, the states are the queue's length against its capacity, and the outcome is data
(``admit``, ``drop_oldest``, or the refusal's error body)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.admission import (
    PRIORITY_RANK,
    AdmissionPolicy,
    AdmissionReject,
    OnFull,
    admit,
    dropped_error,
)

CAPACITY = {"interactive": 3, "batch": 1}
RETRY_AFTER_MS = 250


@pytest.fixture
def policy(request: pytest.FixtureRequest) -> AdmissionPolicy:
    """The deployment's policy: what a full queue does (``on_full``, parametrized
    indirectly; ``reject`` by default) and how long a refused client waits."""
    on_full: OnFull = getattr(request, "param", "reject")
    return AdmissionPolicy(capacity=dict(CAPACITY), on_full=on_full, retry_after_ms=RETRY_AFTER_MS)


def outcome(policy: AdmissionPolicy, *, priority: str, queued: int) -> Any:
    """The rule's answer as data: its verdict, or the refusal's error body."""
    try:
        return admit(policy, priority=priority, queued=queued)
    except AdmissionReject as exc:
        return exc.body()


def refused(priority: str, queued: int) -> dict[str, Any]:
    capacity = CAPACITY[priority]
    return {
        "code": "ADMISSION_REJECT",
        "message": f"the {priority} queue is full ({queued} of {capacity} steps waiting)",
        "retriable": True,
        "retry_after_ms": RETRY_AFTER_MS,
        "details": {"priority": priority, "queued": queued, "capacity": capacity},
    }


# (priority, queued): below, at and past each priority's capacity
_STATES = [("interactive", 0), ("interactive", 2), ("interactive", 3), ("interactive", 7)]
_STATES += [("batch", 0), ("batch", 1), ("batch", 4)]


@pytest.mark.parametrize(("priority", "queued"), _STATES)
@pytest.mark.parametrize("policy", ["reject", "drop-lru"], indirect=True)
def test_a_queue_with_room_admits_and_a_full_one_follows_the_policy(
    policy: AdmissionPolicy, priority: str, queued: int
) -> None:
    if queued < CAPACITY[priority]:
        expected: Any = "admit"  # whatever the policy: it decides only for a full queue
    elif policy.on_full == "drop-lru":
        expected = "drop_oldest"
    else:
        expected = refused(priority, queued)
    assert outcome(policy, priority=priority, queued=queued) == expected


@pytest.mark.parametrize("policy", ["reject", "drop-lru"], indirect=True)
@pytest.mark.parametrize("queued", [0, 1])
def test_a_queue_of_no_capacity_refuses_whatever_the_policy(
    policy: AdmissionPolicy, queued: int
) -> None:
    """A priority given no room takes no step: dropping the oldest of none admits nothing."""
    closed = AdmissionPolicy(
        capacity={**CAPACITY, "batch": 0},
        on_full=policy.on_full,
        retry_after_ms=policy.retry_after_ms,
    )
    assert outcome(closed, priority="batch", queued=queued) == {
        **refused("batch", queued),
        "message": f"the batch queue is full ({queued} of 0 steps waiting)",
        "details": {"priority": "batch", "queued": queued, "capacity": 0},
    }


@pytest.mark.parametrize("policy", ["reject", "drop-lru"], indirect=True)
def test_each_priority_is_its_own_queue(policy: AdmissionPolicy) -> None:
    """A full batch queue does not refuse an interactive step, nor the reverse."""
    assert outcome(policy, priority="interactive", queued=0) == "admit"
    assert outcome(policy, priority="batch", queued=0) == "admit"
    full_batch = outcome(policy, priority="batch", queued=1)
    assert full_batch == ("drop_oldest" if policy.on_full == "drop-lru" else refused("batch", 1))
    assert outcome(policy, priority="interactive", queued=1) == "admit"


def test_the_default_policy_rejects_and_asks_for_a_second() -> None:
    default = AdmissionPolicy(capacity={"interactive": 1, "batch": 1})
    assert default.on_full == "reject"
    body = outcome(default, priority="batch", queued=1)
    assert (body["code"], body["retry_after_ms"]) == ("ADMISSION_REJECT", 1000)


@pytest.mark.parametrize(("priority", "capacity"), [("interactive", 3), ("batch", 0)])
def test_a_dropped_step_ends_with_its_own_retriable_error(priority: str, capacity: int) -> None:
    assert dropped_error(priority, capacity).body() == {
        "code": "QUEUE_FULL_DROP_LRU",
        "message": f"dropped from the full {priority} queue to admit a newer step",
        "retriable": True,
        "retry_after_ms": 1000,
        "details": {"priority": priority, "capacity": capacity},
    }


def test_interactive_steps_rank_ahead_of_batch_steps() -> None:
    """The queues' order: a lower rank is claimed first."""
    assert sorted(PRIORITY_RANK, key=PRIORITY_RANK.__getitem__) == ["interactive", "batch"]
