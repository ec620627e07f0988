"""Placement's rule alone over the states of the pools it chooses among
(orchestrator_core.placement). A fixture builds a fleet of two pools, each free, busy (ready,
no free slot) or down (not ready); every placement form meets every state of the fleet, and
the outcome is data: the pool chosen, or the error's code and details. (``test_placement.py``
holds the rule's finer points: ties, orders, malformed placements.)"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from orchestrator_core.errors import OrchestratorError
from orchestrator_core.placement import PoolView, choose_pool, eligible_pools, validate_placement

STATES: dict[str, dict[str, Any]] = {
    "free": {"ready": True, "free_slots": 2},
    "busy": {"ready": True, "free_slots": 0},
    "down": {"ready": False, "free_slots": 5},  # its slots count for nothing
}
FLEETS = list(itertools.product(STATES, STATES))  # (pool a's state, pool b's state)


@pytest.fixture
def fleet(request: pytest.FixtureRequest) -> list[PoolView]:
    """Pools ``a`` (tagged gpu=h100) and ``b`` (gpu=h100, zone=eu), in the states given."""
    state_a, state_b = request.param
    return [
        PoolView(pool_id="a", tags={"gpu": "h100"}, **STATES[state_a]),
        PoolView(pool_id="b", tags={"gpu": "h100", "zone": "eu"}, **STATES[state_b]),
    ]


def placed(placement: Any, fleet: list[PoolView], field: str = "placement") -> dict[str, Any]:
    """The rule's outcome as data."""
    try:
        return {"pool": choose_pool(placement, fleet, field=field)}
    except OrchestratorError as exc:
        return {"code": exc.code, "retriable": exc.retriable, "details": exc.details}


def unavailable(*eligible: str) -> dict[str, Any]:
    return {"code": "POOL_UNAVAILABLE", "retriable": True, "details": {"eligible": list(eligible)}}


# auto, and an affinity both pools have: the ready pool with most free slots (ties: the
# smaller id); none ready: unavailable
_AUTO = {
    ("free", "free"): {"pool": "a"},
    ("free", "busy"): {"pool": "a"},
    ("free", "down"): {"pool": "a"},
    ("busy", "free"): {"pool": "b"},
    ("busy", "busy"): {"pool": "a"},
    ("busy", "down"): {"pool": "a"},
    ("down", "free"): {"pool": "b"},
    ("down", "busy"): {"pool": "b"},
    ("down", "down"): unavailable("a", "b"),
}


@pytest.mark.parametrize("fleet", FLEETS, indirect=True, ids="-".join)
@pytest.mark.parametrize("placement", ["auto", None, {"affinity": {"gpu": "h100"}}], ids=repr)
def test_auto_takes_the_ready_pool_with_most_free_slots(
    fleet: list[PoolView], placement: Any
) -> None:
    state = (_state(fleet[0]), _state(fleet[1]))
    assert placed(placement, fleet) == _AUTO[state]


@pytest.mark.parametrize("fleet", FLEETS, indirect=True, ids="-".join)
@pytest.mark.parametrize("pinned", ["a", "b"])
def test_a_pin_is_honored_in_every_state_of_its_pool(fleet: list[PoolView], pinned: str) -> None:
    """Busy or down, the step waits in that pool's queue."""
    assert placed({"pin": pinned}, fleet) == {"pool": pinned}


@pytest.mark.parametrize("fleet", FLEETS, indirect=True, ids="-".join)
def test_an_affinity_only_one_pool_has_takes_it_while_it_is_ready(
    fleet: list[PoolView],
) -> None:
    """Unlike a pin, it does not wait for a pool that is down."""
    expected = unavailable("b") if _state(fleet[1]) == "down" else {"pool": "b"}
    assert placed({"affinity": {"zone": "eu"}}, fleet) == expected


@pytest.mark.parametrize("fleet", FLEETS, indirect=True, ids="-".join)
@pytest.mark.parametrize("field", ["placement", "pool_policy", "steps[0].placement"])
@pytest.mark.parametrize(
    ("placement", "suffix"),
    [({"pin": "c"}, ".pin"), ({"affinity": {"zone": "us"}}, ".affinity"), ("best", "")],
    ids=repr,
)
def test_a_placement_no_pool_can_take_is_bad_input_in_every_state(
    fleet: list[PoolView], field: str, placement: Any, suffix: str
) -> None:
    """It names the field it came from (the step's placement, or the run's pool policy)."""
    got = placed(placement, fleet, field)
    assert (got["code"], got["retriable"]) == ("INVALID_PARAMS", False)
    assert [e["field"] for e in got["details"]["errors"]] == [field + suffix]
    with pytest.raises(OrchestratorError) as refused:
        validate_placement(placement, fleet, field=field)
    assert refused.value.details == got["details"]


@pytest.mark.parametrize("fleet", FLEETS, indirect=True, ids="-".join)
@pytest.mark.parametrize(
    ("placement", "eligible"),
    [
        ("auto", ["a", "b"]),
        ({"pin": "a"}, ["a"]),
        ({"affinity": {"gpu": "h100"}}, ["a", "b"]),
        ({"affinity": {"zone": "eu"}}, ["b"]),
        ({"affinity": {}}, ["a", "b"]),
    ],
    ids=repr,
)
def test_which_pools_are_eligible_does_not_depend_on_their_state(
    fleet: list[PoolView], placement: Any, eligible: list[str]
) -> None:
    """What a submission validates against: a placement is possible whatever the pools'
    health now."""
    validate_placement(placement, fleet, field="placement")
    assert [p.pool_id for p in eligible_pools(placement, fleet, field="placement")] == eligible


def _state(pool: PoolView) -> str:
    return next(
        name
        for name, s in STATES.items()
        if (s["ready"], s["free_slots"]) == (pool.ready, pool.free_slots)
    )
