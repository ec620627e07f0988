"""Placement: choose a pool for a step from ``auto | {pin} | {affinity}``.

Deterministic: among eligible ready pools, the one with most free slots wins and ties go to
the smallest pool id, so one view of the pools always gives one answer. A pin is honored
even when its pool is busy: the step waits in that pool's queue.

Eligible pools serve what the step asks for (:class:`Needs`): the model it names, and each
feature its parameters need (``logprobs``, ``json_schema``). A pool whose engine has not
said what it serves (it has not answered yet) is not ruled out for it. A step no pool can
serve is bad input naming the field that asks, and what the pools serve instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator_core.errors import InvalidParams, PoolUnavailable
from orchestrator_core.generation import LlmInput


@dataclass(frozen=True)
class PoolView:
    pool_id: str
    tags: Mapping[str, str]
    ready: bool
    free_slots: int
    models: frozenset[str] = frozenset()  # empty: not known yet
    features: frozenset[str] | None = None  # None: not known yet


@dataclass(frozen=True)
class Needs:
    """What a step asks of the engine that runs it, each with the request field asking."""

    model: tuple[str, str] | None = None  # (model, field)
    features: tuple[tuple[str, str], ...] = ()  # ((feature, field), ...)

    @classmethod
    def of(cls, llm: LlmInput | None) -> Needs:
        if llm is None:
            return cls()
        params = llm.params
        features = [("logprobs", "input.params.logprobs")] if params.logprobs else []
        if params.json_schema is not None:
            features.append(("json_schema", "input.params.json_schema"))
        model = (llm.model, "input.model") if llm.model else None
        return cls(model=model, features=tuple(features))


def serving(pools: Sequence[PoolView], needs: Needs) -> list[PoolView]:
    """The pools that serve what the step asks for; none is bad input naming the field."""
    left = list(pools)
    if needs.model is not None:
        model, field = needs.model
        serves = [p for p in left if not p.models or model in p.models]
        if not serves:
            served = ", ".join(f"{m} ({p.pool_id})" for p in left for m in sorted(p.models))
            raise InvalidParams(f"no pool serves model {model!r} (served: {served})", field=field)
        left = serves
    for feature, field in needs.features:
        offer = [p for p in left if p.features is None or feature in p.features]
        if not offer:
            among = ", ".join(sorted(p.pool_id for p in left))
            raise InvalidParams(
                f"no pool that may take this step offers {feature} ({among})", field=field
            )
        left = offer
    return left


def eligible_pools(placement: Any, pools: Sequence[PoolView], *, field: str) -> list[PoolView]:
    """The pools ``placement`` allows; an impossible placement is bad input naming ``field``."""
    if placement is None or placement == "auto":
        return list(pools)
    if isinstance(placement, dict) and "pin" in placement:
        wanted = placement["pin"]
        match = [p for p in pools if p.pool_id == wanted]
        if not match:
            known = ", ".join(sorted(p.pool_id for p in pools))
            raise InvalidParams(f"no pool {wanted!r} (pools: {known})", field=f"{field}.pin")
        return match
    if isinstance(placement, dict) and "affinity" in placement:
        tags: dict[str, str] = placement["affinity"]
        match = [p for p in pools if all(p.tags.get(k) == v for k, v in tags.items())]
        if not match:
            raise InvalidParams(f"no pool has all the tags {tags}", field=f"{field}.affinity")
        return match
    raise InvalidParams('must be "auto", {"pin": pool_id} or {"affinity": {...}}', field=field)


def validate_placement(placement: Any, pools: Sequence[PoolView], *, field: str) -> None:
    eligible_pools(placement, pools, field=field)


def choose_pool(
    placement: Any, pools: Sequence[PoolView], *, field: str, needs: Needs = Needs()
) -> str:
    eligible = serving(eligible_pools(placement, pools, field=field), needs)
    if len(eligible) == 1 and isinstance(placement, dict) and "pin" in placement:
        return eligible[0].pool_id
    ready = [p for p in eligible if p.ready]
    if not ready:
        raise PoolUnavailable(
            "no eligible pool is ready",
            details={"eligible": sorted(p.pool_id for p in eligible)},
            retry_after_ms=1000,
        )
    return min(ready, key=lambda p: (-p.free_slots, p.pool_id)).pool_id
