"""Pool placement (orchestrator_core.placement)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from orchestrator_core.errors import InvalidParams, PoolUnavailable
from orchestrator_core.placement import PoolView, choose_pool, eligible_pools, validate_placement

FIELD = "placement"


def pool(
    pool_id: str, free: int = 1, *, ready: bool = True, tags: dict[str, str] | None = None
) -> PoolView:
    return PoolView(pool_id=pool_id, tags=tags or {}, ready=ready, free_slots=free)


def _field_of(exc: InvalidParams) -> str:
    assert exc.code == "INVALID_PARAMS"
    [error] = exc.details["errors"]
    assert error["field"] == exc.field
    return exc.field


# --- auto --------------------------------------------------------------------------------------


@pytest.mark.parametrize("placement", ["auto", None])
def test_auto_picks_most_free_slots(placement: Any) -> None:
    pools = [pool("a", 1), pool("b", 5), pool("c", 3)]
    assert choose_pool(placement, pools, field=FIELD) == "b"


def test_auto_ties_go_to_smallest_pool_id() -> None:
    pools = [pool("p3", 4), pool("p1", 4), pool("p2", 4), pool("p0", 2)]
    assert choose_pool("auto", pools, field=FIELD) == "p1"


def test_auto_is_independent_of_pool_order() -> None:
    pools = [pool("m", 2), pool("k", 7), pool("z", 7), pool("a", 1)]
    answers = {
        choose_pool("auto", list(perm), field=FIELD) for perm in itertools.permutations(pools)
    }
    assert answers == {"k"}


def test_auto_skips_pools_not_ready() -> None:
    pools = [pool("a", 10, ready=False), pool("b", 1), pool("c", 2, ready=False)]
    assert choose_pool("auto", pools, field=FIELD) == "b"


def test_auto_takes_a_ready_pool_with_no_free_slots() -> None:
    pools = [pool("a", 0), pool("b", 5, ready=False)]
    assert choose_pool("auto", pools, field=FIELD) == "a"


def test_auto_prefers_free_slots_over_id() -> None:
    assert choose_pool("auto", [pool("a", 0), pool("b", 1)], field=FIELD) == "b"


def test_pool_id_order_is_string_order() -> None:
    assert choose_pool("auto", [pool("pool-10", 2), pool("pool-9", 2)], field=FIELD) == "pool-10"


def test_auto_with_no_ready_pool_is_pool_unavailable() -> None:
    pools = [pool("b", 3, ready=False), pool("a", 1, ready=False)]
    with pytest.raises(PoolUnavailable) as info:
        choose_pool("auto", pools, field=FIELD)
    exc = info.value
    assert exc.code == "POOL_UNAVAILABLE"
    assert exc.retriable is True
    assert exc.retry_after_ms == 1000
    assert exc.details == {"eligible": ["a", "b"]}


def test_auto_with_no_pools_is_pool_unavailable() -> None:
    with pytest.raises(PoolUnavailable) as info:
        choose_pool("auto", [], field=FIELD)
    assert info.value.retriable is True
    assert info.value.details == {"eligible": []}


# --- pin ---------------------------------------------------------------------------------------


def test_pin_chooses_that_pool() -> None:
    pools = [pool("a", 9), pool("b", 1)]
    assert choose_pool({"pin": "b"}, pools, field=FIELD) == "b"


def test_pin_honored_when_pool_not_ready() -> None:
    pools = [pool("a", 9), pool("b", 1, ready=False)]
    assert choose_pool({"pin": "b"}, pools, field=FIELD) == "b"


def test_pin_honored_when_pool_busy() -> None:
    pools = [pool("a", 9), pool("b", 0)]
    assert choose_pool({"pin": "b"}, pools, field=FIELD) == "b"


def test_pin_honored_when_busy_and_not_ready() -> None:
    pools = [pool("a", 9), pool("b", 0, ready=False)]
    assert choose_pool({"pin": "b"}, pools, field=FIELD) == "b"


@pytest.mark.parametrize("field", ["placement", "steps[2].placement"])
def test_unknown_pin_is_invalid_params(field: str) -> None:
    pools = [pool("b"), pool("a")]
    with pytest.raises(InvalidParams) as info:
        choose_pool({"pin": "nope"}, pools, field=field)
    assert _field_of(info.value) == f"{field}.pin"
    assert "'nope'" in info.value.message
    assert "a, b" in info.value.message  # the known pools, sorted


def test_unknown_pin_with_no_pools() -> None:
    with pytest.raises(InvalidParams) as info:
        choose_pool({"pin": "x"}, [], field=FIELD)
    assert _field_of(info.value) == "placement.pin"


# --- affinity ----------------------------------------------------------------------------------


AFFINITY_POOLS = [
    pool("gpu-a", 2, tags={"gpu": "h100", "zone": "eu"}),
    pool("gpu-b", 5, tags={"gpu": "h100", "zone": "us"}),
    pool("cpu-a", 9, tags={"zone": "eu"}),
    pool("gpu-c", 5, tags={"gpu": "a100", "zone": "eu"}),
]


@pytest.mark.parametrize(
    ("affinity", "eligible", "chosen"),
    [
        ({"gpu": "h100"}, ["gpu-a", "gpu-b"], "gpu-b"),
        ({"zone": "eu"}, ["gpu-a", "cpu-a", "gpu-c"], "cpu-a"),
        ({"gpu": "h100", "zone": "eu"}, ["gpu-a"], "gpu-a"),
        ({"gpu": "a100"}, ["gpu-c"], "gpu-c"),
        ({}, ["gpu-a", "gpu-b", "cpu-a", "gpu-c"], "cpu-a"),
    ],
)
def test_affinity_match(affinity: dict[str, str], eligible: list[str], chosen: str) -> None:
    placement = {"affinity": affinity}
    found = eligible_pools(placement, AFFINITY_POOLS, field=FIELD)
    assert [p.pool_id for p in found] == eligible
    assert choose_pool(placement, AFFINITY_POOLS, field=FIELD) == chosen


def test_affinity_tie_goes_to_smallest_id() -> None:
    pools = [pool("z", 3, tags={"k": "v"}), pool("y", 3, tags={"k": "v"}), pool("a", 9)]
    assert choose_pool({"affinity": {"k": "v"}}, pools, field=FIELD) == "y"


@pytest.mark.parametrize(
    "affinity",
    [{"gpu": "v100"}, {"rack": "1"}, {"gpu": "h100", "zone": "ap"}, {"gpu": "a100", "zone": "us"}],
)
def test_affinity_no_match_is_invalid_params(affinity: dict[str, str]) -> None:
    with pytest.raises(InvalidParams) as info:
        choose_pool({"affinity": affinity}, AFFINITY_POOLS, field="body.placement")
    assert _field_of(info.value) == "body.placement.affinity"


def test_affinity_match_but_none_ready_is_pool_unavailable() -> None:
    pools = [pool("a", 3, ready=False, tags={"k": "v"}), pool("b", 3, tags={"k": "w"})]
    with pytest.raises(PoolUnavailable) as info:
        choose_pool({"affinity": {"k": "v"}}, pools, field=FIELD)
    assert info.value.retriable is True
    assert info.value.details == {"eligible": ["a"]}


def test_affinity_skips_unready_matches() -> None:
    pools = [pool("a", 9, ready=False, tags={"k": "v"}), pool("b", 1, tags={"k": "v"})]
    assert choose_pool({"affinity": {"k": "v"}}, pools, field=FIELD) == "b"


# --- malformed placements ----------------------------------------------------------------------


@pytest.mark.parametrize("placement", ["best", "", 1, [], {}, {"pool": "a"}, ["auto"]], ids=repr)
def test_malformed_placement_is_invalid_params(placement: Any) -> None:
    with pytest.raises(InvalidParams) as info:
        choose_pool(placement, [pool("a")], field="my.field")
    assert _field_of(info.value) == "my.field"


# --- validate / eligible -----------------------------------------------------------------------


def test_eligible_auto_is_all_pools_even_unready() -> None:
    pools = [pool("a", ready=False), pool("b")]
    assert eligible_pools("auto", pools, field=FIELD) == pools


def test_validate_placement_accepts_unready_pools() -> None:
    pools = [pool("a", ready=False)]
    validate_placement("auto", pools, field=FIELD)
    validate_placement({"pin": "a"}, pools, field=FIELD)
    validate_placement({"affinity": {}}, pools, field=FIELD)


def test_validate_placement_refuses_impossible_placements() -> None:
    pools = [pool("a", tags={"k": "v"})]
    with pytest.raises(InvalidParams) as pin:
        validate_placement({"pin": "b"}, pools, field=FIELD)
    assert pin.value.field == "placement.pin"
    with pytest.raises(InvalidParams) as affinity:
        validate_placement({"affinity": {"k": "w"}}, pools, field=FIELD)
    assert affinity.value.field == "placement.affinity"


def test_choice_does_not_mutate_pools() -> None:
    pools = [pool("b", 2), pool("a", 2)]
    before = list(pools)
    choose_pool("auto", pools, field=FIELD)
    assert pools == before
