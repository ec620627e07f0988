"""Placement's selectors, replica states and the decision it records
(orchestrator_core.placement): each candidate replica with its reason, the rule, the pool
chosen; the same pools always give the same decision."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.errors import InvalidParams, PoolUnavailable
from orchestrator_core.placement import (
    Needs,
    PoolView,
    ReplicaView,
    decide,
    narration,
    validate_placement,
)


def pool(pool_id: str, tags: dict[str, str], *states: tuple[str, int], **kw: Any) -> PoolView:
    """A pool whose replicas ``r0``, ``r1``... have the (state, free slots) given."""
    replicas = tuple(
        ReplicaView(replica_id=f"r{i}", free_slots=free, state=state)
        for i, (state, free) in enumerate(states)
    )
    return PoolView(
        pool_id=pool_id,
        tags=tags,
        ready=any(r.state == "ready" for r in replicas),
        free_slots=sum(r.free_slots for r in replicas if r.state == "ready"),
        replicas=replicas,
        **kw,
    )


EU = pool("eu-a100", {"region": "eu", "tier": "gold"}, ("ready", 2), vram_gib=40)
US = pool("us-h100", {"region": "us", "tier": "gold"}, ("ready", 1), ("ready", 1), vram_gib=80)
AP = pool("ap-cpu", {"region": "ap"}, ("ready", 8))
FLEET = [EU, US, AP]


def chosen(affinity: dict[str, Any], pools: list[PoolView] = FLEET) -> str:
    return decide({"affinity": affinity}, pools, field="placement").pool_id


def test_a_selector_takes_tags_in_not_in_vram_and_features() -> None:
    assert chosen({"tags": {"tier": "gold"}}) == "eu-a100"  # 2 free; us-h100 2 too: by id
    assert chosen({"in": {"region": ["us", "ap"]}}) == "ap-cpu"  # most free
    assert chosen({"in": {"region": ["us", "ap"]}, "not_in": {"region": ["ap"]}}) == "us-h100"
    assert chosen({"not_in": {"tier": ["gold"]}}) == "ap-cpu"  # a tag it lacks is not in
    assert chosen({"min_vram_gib": 41}) == "us-h100"
    assert chosen({"min_vram_gib": 40}) == "eu-a100"
    with_features = [
        PoolView(**{**EU.__dict__, "features": frozenset({"logprobs"})}),
        PoolView(**{**US.__dict__, "features": frozenset({"logprobs", "json_schema"})}),
    ]
    assert chosen({"features": ["json_schema"]}, with_features) == "us-h100"


def test_the_v1_tag_map_keeps_its_meaning() -> None:
    assert chosen({"region": "us"}) == "us-h100"
    tagged = pool("odd", {"features": "x"}, ("ready", 1))
    assert chosen({"features": "x"}, [*FLEET, tagged]) == "odd"  # a tag named features


@pytest.mark.parametrize(
    ("affinity", "reasons"),
    [
        (
            {"min_vram_gib": 100},
            ["vram 40 GiB < 100 GiB", "vram 80 GiB < 100 GiB", "vram no GPU declared < 100 GiB"],
        ),
        ({"in": {"region": ["sa"]}}, ["region='eu' not in ['sa']"]),
        ({"region": "sa"}, ["tags differ: region='eu'"]),
    ],
)
def test_a_selector_no_pool_meets_is_bad_input_with_each_pools_reason(
    affinity: dict[str, Any], reasons: list[str]
) -> None:
    with pytest.raises(InvalidParams) as caught:
        chosen(affinity)
    assert caught.value.field == "placement.affinity"
    for reason in reasons:
        assert reason in caught.value.message
    with pytest.raises(InvalidParams):  # a run's pool_policy is checked the same way
        validate_placement({"affinity": affinity}, FLEET, field="pool_policy")


def test_the_decision_lists_every_replica_with_its_reason() -> None:
    fleet = [
        pool("a", {"region": "eu"}, ("ready", 1), ("draining", 0), ("breaker_open", 0)),
        pool("b", {"region": "eu"}, ("unready", 0), ("ready", 3)),
        pool("c", {"region": "us"}, ("ready", 9)),
    ]
    placed = decide({"affinity": {"region": "eu"}}, fleet, field="placement")
    assert placed.pool_id == "b"
    assert placed.as_dict("r1") == {
        "rule": "affinity",
        "tie_break": "most free slots, then the smallest pool id",
        "chosen": {"pool_id": "b", "replica_id": "r1"},
        "candidates": [
            {"pool_id": "a", "replica_id": "r0", "eligible": True, "reason": None, "free_slots": 1},
            {
                "pool_id": "a",
                "replica_id": "r1",
                "eligible": False,
                "reason": "draining",
                "free_slots": 0,
            },
            {
                "pool_id": "a",
                "replica_id": "r2",
                "eligible": False,
                "reason": "breaker_open",
                "free_slots": 0,
            },
            {
                "pool_id": "b",
                "replica_id": "r0",
                "eligible": False,
                "reason": "unready",
                "free_slots": 0,
            },
            {"pool_id": "b", "replica_id": "r1", "eligible": True, "reason": None, "free_slots": 3},
            {
                "pool_id": "c",
                "replica_id": "r0",
                "eligible": False,
                "reason": "tags differ: region='us'",
                "free_slots": 9,
            },
        ],
    }
    assert narration(placed.as_dict("r1")) == "placed on b/r1: 6 candidates; chosen by affinity"
    assert narration(placed.as_dict()) == "placed on b: 6 candidates; chosen by affinity"


def test_replicas_that_take_no_steps_leave_their_pool_unavailable() -> None:
    fleet = [pool("a", {}, ("draining", 0), ("breaker_open", 0)), pool("b", {}, ("unready", 0))]
    with pytest.raises(PoolUnavailable) as caught:
        decide("auto", fleet, field="placement")
    assert caught.value.details == {"eligible": ["a", "b"]}
    pinned = decide({"pin": "a"}, fleet, field="placement")  # a pin waits in its queue
    assert (pinned.pool_id, pinned.rule) == ("a", "pin")


def test_what_the_step_needs_is_a_candidates_reason() -> None:
    fleet = [
        PoolView(**{**EU.__dict__, "models": frozenset({"gemma"})}),
        PoolView(**{**US.__dict__, "models": frozenset({"llama"})}),
    ]
    placed = decide("auto", fleet, field="placement", needs=Needs(model=("llama", "input.model")))
    assert placed.pool_id == "us-h100"
    reasons = {(c.pool_id, c.reason) for c in placed.candidates}
    assert ("eu-a100", "does not serve model llama") in reasons


def test_one_view_of_the_pools_gives_one_decision() -> None:
    for placement in ("auto", {"affinity": {"tags": {"tier": "gold"}}}, {"pin": "ap-cpu"}):
        decisions = {
            repr(decide(placement, order, field="placement").as_dict())
            for order in (FLEET, FLEET[::-1], [US, AP, EU])
        }
        assert len(decisions) == 1
