"""Seeds, as rules alone: a step samples unless its temperature is 0; a seeded run's sampling
step needs an engine with the ``seed`` feature (a greedy one, or an unseeded run's, goes
anywhere); a strict_replay is refused where a recorded step sampled on an engine without
seeds, naming the pool, the engine and the step."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.errors import InvalidParams, PoolUnavailable
from orchestrator_core.generation import SamplingParams, normalize_llm_input
from orchestrator_core.placement import Needs, PoolView, choose_pool, decide
from orchestrator_core.replay import RecordedSample, StrictReplayMismatch, seedless_mismatches

SIM = PoolView(
    pool_id="sim",
    tags={},
    ready=True,
    free_slots=2,
    features=frozenset({"seed", "stop", "token_ids"}),
)
SAL = PoolView(  # more free slots: chosen when a seed does not matter
    pool_id="sal",
    tags={"kind": "session"},
    ready=True,
    free_slots=8,
    features=frozenset({"stop", "token_ids", "logprobs", "sessions"}),
)
NEW = PoolView(pool_id="new", tags={}, ready=True, free_slots=1)  # not described yet


def needs(temperature: float | None = None, *, seeded: bool) -> Needs:
    params: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
    llm = normalize_llm_input(prompt="hi", messages=None, params=params, model=None)
    return Needs.of(llm, seeded=seeded)


def test_a_step_samples_unless_its_temperature_is_0() -> None:
    assert SamplingParams().samples  # an omitted temperature is the default, 1.0
    assert SamplingParams(temperature=0.7).samples
    assert not SamplingParams(temperature=0.0).samples


def test_a_seeded_run_s_sampling_step_needs_a_seed() -> None:
    seed = ("seed", "input.params.temperature")
    assert needs(seeded=True).features == (seed,)
    assert needs(0.7, seeded=True).features == (seed,)
    assert needs(0.0, seeded=True).features == ()  # greedy: the same tokens anywhere
    assert needs(0.7, seeded=False).features == ()  # the server drew the seed
    assert Needs.of(None, seeded=True) == Needs()
    # the existing callers' form is unchanged
    llm = normalize_llm_input(prompt="hi", messages=None, params=None, model=None)
    assert Needs.of(llm) == Needs.of(llm, seeded=False) == Needs()


@pytest.mark.parametrize(
    ("placement", "asked", "chosen"),
    [
        ("auto", needs(0.7, seeded=True), "sim"),
        ("auto", needs(seeded=True), "sim"),
        ("auto", needs(0.0, seeded=True), "sal"),
        ("auto", needs(0.7, seeded=False), "sal"),
        ({"pin": "sal"}, needs(0.0, seeded=True), "sal"),
        ({"pin": "sal"}, needs(0.7, seeded=False), "sal"),
    ],
)
def test_where_a_step_goes(placement: Any, asked: Needs, chosen: str) -> None:
    assert choose_pool(placement, [SAL, SIM], field="placement", needs=asked) == chosen


def test_an_engine_without_seeds_is_passed_over_with_its_reason() -> None:
    placed = decide("auto", [SAL, SIM], field="placement", needs=needs(0.7, seeded=True))
    assert {c.pool_id: (c.eligible, c.reason, c.cause) for c in placed.candidates} == {
        "sal": (False, "lacks seed", "feature"),
        "sim": (True, None, None),
    }


def test_an_engine_that_has_not_reported_is_not_ruled_out() -> None:
    asked = needs(0.7, seeded=True)
    assert choose_pool({"pin": "new"}, [SAL, NEW], field="placement", needs=asked) == "new"
    assert choose_pool("auto", [SAL, NEW], field="placement", needs=asked) == "new"


@pytest.mark.parametrize("placement", [{"pin": "sal"}, {"affinity": {"kind": "session"}}])
def test_no_engine_with_seeds_left_is_bad_input_naming_the_feature(placement: Any) -> None:
    with pytest.raises(InvalidParams) as caught:
        decide(placement, [SAL, SIM], field="placement", needs=needs(0.7, seeded=True))
    assert caught.value.field == "input.params.temperature"
    assert "no pool that may take this step offers seed (sal)" in caught.value.message
    assert "temperature 0" in caught.value.message


def sample(step_id: str, pool_id: str, replica_id: str = "r0") -> RecordedSample:
    return RecordedSample(step_id=step_id, pool_id=pool_id, replica_id=replica_id, temperature=0.7)


def mismatches(*sampled: RecordedSample) -> list[dict[str, Any]]:
    return seedless_mismatches(
        recorded_seed=42,
        sampled=sampled,
        features={p.pool_id: p.features for p in (SIM, SAL, NEW)},
        engines={("sal", "r0"): "salience", ("sim", "r0"): "sim", ("new", "r0"): "uma"},
    )


def test_a_strict_replay_of_a_sample_on_an_engine_without_seeds_names_it() -> None:
    out = mismatches(sample("step_1", "sim"), sample("step_2", "sal"), sample("step_3", "sal"))
    message = (
        "strict_replay needs a seeded engine: pool 'sal' (engine salience) has no seed, and"
        " step step_2 sampled (temperature 0.7)"
    )
    assert out == [  # one per pool, naming its first step that sampled
        {
            "input": "seed",
            "pool_id": "sal",
            "replica_id": "r0",
            "recorded": 42,
            "current": None,
            "engine": "salience",
            "step_id": "step_2",
            "temperature": 0.7,
            "message": message,
        }
    ]
    refusal = StrictReplayMismatch(out)
    assert refusal.code == "STRICT_REPLAY_MISMATCH"
    assert refusal.message.endswith(f"(seed): {message}")


def test_engines_with_seeds_unknown_or_gone_are_not_refused_here() -> None:
    # (a gone replica is refused as a ``replica`` mismatch by run_mismatches)
    gone = (sample("c", "gone"), sample("d", "sal", replica_id="r9"))
    assert mismatches(sample("a", "sim"), sample("b", "new"), *gone) == []
    assert mismatches() == []


def test_with_no_pool_at_all_none_is_ready() -> None:
    """(not "no pool offers seed": nothing was ruled out for what the step asks)"""
    with pytest.raises(PoolUnavailable):
        decide("auto", [], field="placement", needs=needs(0.7, seeded=True))
