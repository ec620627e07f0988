"""Placement: choose a pool for a step from ``auto | {pin} | {affinity}``.

Deterministic: among eligible ready pools, the one with most free slots wins and ties go to
the smallest pool id, so one view of the pools always gives one answer. A pin is honored
even when its pool is busy: the step waits in that pool's queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator_core.errors import InvalidParams, PoolUnavailable


@dataclass(frozen=True)
class PoolView:
    pool_id: str
    tags: Mapping[str, str]
    ready: bool
    free_slots: int


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


def choose_pool(placement: Any, pools: Sequence[PoolView], *, field: str) -> str:
    eligible = eligible_pools(placement, pools, field=field)
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
