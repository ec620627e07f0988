"""The policy evaluator of a run, compiled once per policy rather than once per step."""

from __future__ import annotations

from collections import OrderedDict

from orchestrator_core.policy import RulePolicy
from orchestratord.db.models import Run

_CACHE: OrderedDict[str, RulePolicy] = OrderedDict()
_CACHE_SIZE = 256


def policy_of(run: Run) -> RulePolicy:
    """The run's evaluator, keyed by its policy hash (stored, validated policies only)."""
    key = run.policy_hash
    if not key:  # a run stored before policies were hashed
        return RulePolicy.from_policy(run.policy)
    evaluator = _CACHE.get(key)
    if evaluator is None:
        evaluator = RulePolicy.from_policy(run.policy)
        _CACHE[key] = evaluator
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return evaluator
