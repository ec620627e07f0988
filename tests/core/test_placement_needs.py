"""Placement reads the step: eligible pools serve the model it names and each feature its
parameters need; a step no pool can serve is bad input naming the field that asks, and the
pools an engine has not described yet are not ruled out."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.errors import InvalidParams, PoolUnavailable
from orchestrator_core.generation import normalize_llm_input
from orchestrator_core.placement import Needs, PoolView, choose_pool

SIM = PoolView(
    pool_id="sim",
    tags={},
    ready=True,
    free_slots=8,
    models=frozenset({"sim-1"}),
    features=frozenset({"seed", "stop", "json_schema"}),
)
GPU = PoolView(
    pool_id="gpu",
    tags={"zone": "eu"},
    ready=True,
    free_slots=1,
    models=frozenset({"gemma-3-270m"}),
    features=frozenset({"seed", "stop", "logprobs", "json_schema"}),
)
NEW = PoolView(pool_id="new", tags={}, ready=True, free_slots=4)  # not described yet


def needs(model: str | None = None, params: dict[str, Any] | None = None) -> Needs:
    return Needs.of(normalize_llm_input(prompt="hi", messages=None, params=params, model=model))


def test_what_a_step_asks_for() -> None:
    assert needs() == Needs()
    assert Needs.of(None) == Needs()
    asked = needs(model="m", params={"logprobs": True, "json_schema": {"type": "object"}})
    assert asked.model == ("m", "input.model")
    assert asked.features == (
        ("logprobs", "input.params.logprobs"),
        ("json_schema", "input.params.json_schema"),
    )
    assert needs(params={"logprobs": False}).features == ()


@pytest.mark.parametrize(
    ("placement", "asked", "chosen"),
    [
        ("auto", needs(), "sim"),  # most free slots
        ("auto", needs(model="gemma-3-270m"), "gpu"),
        ("auto", needs(model="sim-1"), "sim"),
        ("auto", needs(params={"logprobs": True}), "gpu"),
        ("auto", needs(params={"json_schema": {"type": "object"}}), "sim"),
        ({"affinity": {"zone": "eu"}}, needs(model="gemma-3-270m"), "gpu"),
        ({"pin": "gpu"}, needs(params={"logprobs": True}), "gpu"),
    ],
)
def test_the_pool_chosen_serves_the_step(placement: Any, asked: Needs, chosen: str) -> None:
    assert choose_pool(placement, [SIM, GPU], field="placement", needs=asked) == chosen


@pytest.mark.parametrize(
    ("placement", "asked", "field", "said"),
    [
        ("auto", needs(model="gpt-4o"), "input.model", "no pool serves model 'gpt-4o'"),
        ({"pin": "sim"}, needs(model="gemma-3-270m"), "input.model", "sim-1 (sim)"),
        ({"pin": "sim"}, needs(params={"logprobs": True}), "input.params.logprobs", "logprobs"),
        (
            {"affinity": {"zone": "eu"}},
            needs(model="sim-1"),
            "input.model",
            "gemma-3-270m (gpu)",
        ),
        (
            "auto",
            needs(model="sim-1", params={"logprobs": True}),
            "input.params.logprobs",
            "offers logprobs (sim)",
        ),
    ],
)
def test_a_step_no_pool_serves_is_refused_naming_what_it_asks(
    placement: Any, asked: Needs, field: str, said: str
) -> None:
    with pytest.raises(InvalidParams) as caught:
        choose_pool(placement, [SIM, GPU], field="placement", needs=asked)
    assert caught.value.details["errors"][0]["field"] == field
    assert said in caught.value.message


def test_a_pool_not_described_yet_is_not_ruled_out() -> None:
    asked = needs(model="gpt-4o", params={"logprobs": True})
    assert choose_pool("auto", [SIM, GPU, NEW], field="placement", needs=asked) == "new"


def test_serving_pools_that_are_down_are_unavailable_not_bad_input() -> None:
    down = PoolView(**{**GPU.__dict__, "ready": False})
    with pytest.raises(PoolUnavailable):
        choose_pool("auto", [SIM, down], field="placement", needs=needs(model="gemma-3-270m"))
