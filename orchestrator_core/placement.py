"""Placement: choose a pool for a step from ``auto | {pin} | {affinity}``, and say why.

The rules, in order, each ruling out candidates (a pool's replicas) with a reason:

1. **The placement's form.** ``auto``: every pool. ``{"pin": P}``: pool P only (an unknown
   pool is bad input). ``{"affinity": {tag: value}}``: pools with every tag equal;
   ``{"affinity": {"tags", "in", "not_in", "min_vram_gib", "features"}}``: pools meeting
   every condition given (``min_vram_gib``: every replica declares a GPU with at least that
   much memory). No pool matching is bad input naming the field.
2. **What the step needs** (:class:`Needs`): the model it names, each feature its
   parameters ask for (``logprobs``, ``json_schema``), and ``seed`` when it samples in a
   seeded run (below). A pool whose engine has not said what it serves (it has not answered
   yet) is not ruled out. Nothing serving it is bad input naming the field that asks, and
   what the pools serve instead.
3. **Whether a replica takes steps now**: not ``unready`` (its health), not ``draining``,
   its circuit breaker not ``breaker_open``. A pool with no such replica is not ready.

Among the ready pools left, the one with most free slots wins, ties to the smallest pool
id: one view of the pools always gives one answer (what strict_replay relies on: a replay
goes where its recording ran, and a record run placed by the same rules over the same
pools lands the same). A pin is honoured even when its pool is busy: the step waits in
that pool's queue. The decision (:class:`Placed`) lists every candidate and its reason.

**Seeds.** A seed only decides the output of a step that samples (temperature above 0; an
omitted temperature is the default, 1.0): a greedy step (temperature 0) gives the same
tokens on any engine. Every run has a seed (the server draws one when the request gives
none), so only a run whose creator gave one explicitly (``seed_given``) is *seeded*: there a
step that samples needs an engine reporting the ``seed`` feature (``Needs.of(llm,
seeded=True)``); a pin to a pool without it is bad input naming ``input.params.temperature``,
as is an ``auto`` or affinity placement that leaves no such pool. Runs without an explicit
seed place their steps on any engine, as before. The rule at run creation (a seeded run
pinned to an engine without seeds, a strict_replay of steps that sampled on one) is the
caller's (``orchestratord.runs.service``, ``orchestrator_core.replay``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contracts.common import PLACEMENT_FORMS, affinity_form, placement_form
from orchestrator_core.errors import InvalidParams, PoolUnavailable
from orchestrator_core.generation import LlmInput

TIE_BREAK = "most free slots, then the smallest pool id"
READY = "ready"
# The feature of an engine that takes a seed: the same seed gives the same sampled tokens.
SEED = "seed"
# What a seeded run's sampling step is told when no pool it may go to takes a seed.
_SEED_HINT = (
    "; the run has a seed and this step samples (temperature above 0): an engine without"
    " seeds cannot reproduce it, a greedy step (temperature 0) runs on any engine"
)


@dataclass(frozen=True)
class ReplicaView:
    replica_id: str
    free_slots: int
    state: str = READY  # ready | unready | draining | breaker_open


@dataclass(frozen=True)
class PoolView:
    pool_id: str
    tags: Mapping[str, str]
    ready: bool
    free_slots: int
    models: frozenset[str] = frozenset()  # empty: not known yet
    features: frozenset[str] | None = None  # None: not known yet
    replicas: tuple[ReplicaView, ...] = ()  # empty: the pool alone is the candidate
    vram_gib: int | None = None  # the least any replica declares; None: not every one does

    def candidates(self) -> tuple[ReplicaView, ...]:
        if self.replicas:
            return self.replicas
        state = READY if self.ready else "unready"
        return (ReplicaView(replica_id="", free_slots=self.free_slots, state=state),)


@dataclass(frozen=True)
class Needs:
    """What a step asks of the engine that runs it, each with the request field asking."""

    model: tuple[str, str] | None = None  # (model, field)
    features: tuple[tuple[str, str], ...] = ()  # ((feature, field), ...)

    @classmethod
    def of(cls, llm: LlmInput | None, *, seeded: bool = False) -> Needs:
        """What ``llm`` asks for; ``seeded``: the run's seed was given by its creator, so a
        step that samples needs an engine that takes it (``seed``)."""
        if llm is None:
            return cls()
        params = llm.params
        features = [("logprobs", "input.params.logprobs")] if params.logprobs else []
        if params.json_schema is not None:
            features.append(("json_schema", "input.params.json_schema"))
        if seeded and params.samples:
            features.append((SEED, "input.params.temperature"))
        model = (llm.model, "input.model") if llm.model else None
        return cls(model=model, features=tuple(features))


@dataclass(frozen=True)
class Candidate:
    pool_id: str
    replica_id: str | None
    eligible: bool
    reason: str | None
    free_slots: int
    # why not, as a class (for metrics): placement | model | feature | a replica's state
    cause: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pool_id": self.pool_id,
            "replica_id": self.replica_id,
            "eligible": self.eligible,
            "reason": self.reason,
            "free_slots": self.free_slots,
        }


@dataclass(frozen=True)
class Placed:
    """Where a step goes and why: stored on the step (``placement_decision``)."""

    rule: str  # auto | pin | affinity | replay
    pool_id: str
    candidates: tuple[Candidate, ...] = field(default=())

    def as_dict(self, replica_id: str | None = None) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "tie_break": TIE_BREAK,
            "chosen": {"pool_id": self.pool_id, "replica_id": replica_id},
            "candidates": [c.as_dict() for c in self.candidates],
        }


def narration(decision: Mapping[str, Any]) -> str:
    """What the step's stream says of its placement (``placement_decision`` as stored)."""
    chosen = decision["chosen"]
    where = f"{chosen['pool_id']}/{chosen['replica_id']}" if chosen.get("replica_id") else ""
    n = len(decision.get("candidates") or ())
    said = f"placed on {where or chosen['pool_id']}: {n} candidates; chosen by {decision['rule']}"
    moved = decision.get("moved_from")
    return f"{said} (moved from {moved}: its replicas took no steps)" if moved else said


def placement_rule(placement: Any) -> str:
    """The rule a placement is written in: auto (also when none is given), pin or affinity,
    told as the API tells its forms apart; else ``invalid``."""
    return "auto" if placement is None else placement_form(placement) or "invalid"


# A pool test: None when the pool passes, else why not.
Check = Callable[[PoolView], str | None]


def _form(placement: Any, pools: Sequence[PoolView], *, field: str) -> tuple[str, Check]:
    """The placement's rule name and its test of a pool; an impossible placement (no such
    pool, no pool matching) is bad input naming ``field``."""
    rule = placement_rule(placement)
    if rule == "auto":
        return rule, lambda _: None
    if rule == "pin":
        wanted = placement["pin"]
        if not any(p.pool_id == wanted for p in pools):
            known = ", ".join(sorted(p.pool_id for p in pools))
            raise InvalidParams(f"no pool {wanted!r} (pools: {known})", field=f"{field}.pin")
        return rule, lambda p: None if p.pool_id == wanted else f"not the pinned pool {wanted}"
    if rule == "affinity":
        affinity = placement["affinity"]
        selector = affinity_form(affinity) == "selector"
        check = _selector(affinity) if selector else _tags(affinity)
        if not any(check(p) is None for p in pools):
            reasons = "; ".join(f"{p.pool_id}: {check(p)}" for p in pools)
            what = "matches" if selector else "has all the tags"
            raise InvalidParams(f"no pool {what} {affinity} ({reasons})", field=f"{field}.affinity")
        return rule, check
    raise InvalidParams(f"must be {PLACEMENT_FORMS}", field=field)


def _tags(wanted: Mapping[str, str]) -> Check:
    def check(pool: PoolView) -> str | None:
        differ = [f"{k}={pool.tags.get(k)!r}" for k, v in wanted.items() if pool.tags.get(k) != v]
        return f"tags differ: {', '.join(differ)}" if differ else None

    return check


def _selector(selector: Mapping[str, Any]) -> Check:
    tags = _tags(selector.get("tags") or {})
    within: Mapping[str, list[str]] = selector.get("in") or {}
    outside: Mapping[str, list[str]] = selector.get("not_in") or {}
    min_vram = selector.get("min_vram_gib")
    features: list[str] = selector.get("features") or []

    def check(pool: PoolView) -> str | None:
        if (why := tags(pool)) is not None:
            return why
        for tag, values in within.items():
            if pool.tags.get(tag) not in values:
                return f"{tag}={pool.tags.get(tag)!r} not in {values}"
        for tag, values in outside.items():
            if pool.tags.get(tag) in values:
                return f"{tag}={pool.tags.get(tag)!r} in {values}"
        if min_vram is not None and (pool.vram_gib or 0) < min_vram:
            has = "no GPU declared" if pool.vram_gib is None else f"{pool.vram_gib} GiB"
            return f"vram {has} < {min_vram} GiB"
        lacking = [f for f in features if pool.features is not None and f not in pool.features]
        return f"lacks {', '.join(lacking)}" if lacking else None

    return check


def _serving(pools: Sequence[PoolView], needs: Needs, rule_out: dict[str, tuple[str, str]]) -> None:
    """Rule out (``rule_out``: pool id -> (cause, reason)) the pools not serving what the step asks
    for, among those not ruled out yet; none left is bad input naming the field."""
    left = [p for p in pools if p.pool_id not in rule_out]
    if not left:  # no pool at all: none is ready (``decide``), rather than none serves it
        return
    if needs.model is not None:
        model, field = needs.model
        serves = [p for p in left if not p.models or model in p.models]
        if not serves:
            served = ", ".join(f"{m} ({p.pool_id})" for p in left for m in sorted(p.models))
            raise InvalidParams(f"no pool serves model {model!r} (served: {served})", field=field)
        for p in left:
            if p not in serves:
                rule_out[p.pool_id] = ("model", f"does not serve model {model}")
        left = serves
    for feature, field in needs.features:
        offer = [p for p in left if p.features is None or feature in p.features]
        if not offer:
            among = ", ".join(sorted(p.pool_id for p in left))
            hint = _SEED_HINT if feature == SEED else ""
            raise InvalidParams(
                f"no pool that may take this step offers {feature} ({among}){hint}", field=field
            )
        for p in left:
            if p not in offer:
                rule_out[p.pool_id] = ("feature", f"lacks {feature}")
        left = offer


def decide(
    placement: Any, pools: Sequence[PoolView], *, field: str, needs: Needs = Needs()
) -> Placed:
    """The pool the step goes to, with every candidate and why it was or was not eligible."""
    rule, check = _form(placement, pools, field=field)
    rule_out = {p.pool_id: ("placement", why) for p in pools if (why := check(p)) is not None}
    _serving(pools, needs, rule_out)
    candidates = tuple(
        _candidate(p, r, rule_out.get(p.pool_id))
        for p in sorted(pools, key=lambda p: p.pool_id)
        for r in p.candidates()
    )
    matching = [p for p in pools if p.pool_id not in rule_out]
    if rule == "pin":  # honoured even when busy or down: the step waits in its queue
        return Placed(rule, matching[0].pool_id, candidates)
    ready = {c.pool_id for c in candidates if c.eligible}
    if not ready:
        raise PoolUnavailable(
            "no eligible pool is ready",
            details={"eligible": sorted(p.pool_id for p in matching)},
            retry_after_ms=1000,
        )
    free = {p.pool_id: p.free_slots for p in matching}
    chosen = min(ready, key=lambda pool_id: (-free[pool_id], pool_id))
    return Placed(rule, chosen, candidates)


def _candidate(pool: PoolView, replica: ReplicaView, out: tuple[str, str] | None) -> Candidate:
    """A replica as placement saw it: ruled out with its pool (``out``: cause, reason), or
    by its own state, or eligible."""
    cause, reason = out or ((None, None) if replica.state == READY else (replica.state,) * 2)
    return Candidate(
        pool_id=pool.pool_id,
        replica_id=replica.replica_id or None,
        eligible=cause is None,
        reason=reason,
        free_slots=replica.free_slots,
        cause=cause,
    )


def serving(pools: Sequence[PoolView], needs: Needs) -> list[PoolView]:
    """The pools that serve what the step asks for; none is bad input naming the field."""
    rule_out: dict[str, tuple[str, str]] = {}
    _serving(pools, needs, rule_out)
    return [p for p in pools if p.pool_id not in rule_out]


def eligible_pools(placement: Any, pools: Sequence[PoolView], *, field: str) -> list[PoolView]:
    """The pools ``placement`` allows; an impossible placement is bad input naming ``field``."""
    _, check = _form(placement, pools, field=field)
    return [p for p in pools if check(p) is None]


def validate_placement(placement: Any, pools: Sequence[PoolView], *, field: str) -> None:
    _form(placement, pools, field=field)


def choose_pool(
    placement: Any, pools: Sequence[PoolView], *, field: str, needs: Needs = Needs()
) -> str:
    return decide(placement, pools, field=field, needs=needs).pool_id
