from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from orchestrator_core.policy import RulePolicy
from orchestratord.policies import policy_of

DENY = {"rules": [{"id": "d", "effect": "deny", "match": {"tool": "rm"}}]}


def run(policy: dict[str, Any], policy_hash: str | None = None) -> Any:
    h = policy_hash if policy_hash is not None else RulePolicy.from_policy(policy).policy_hash
    return SimpleNamespace(policy=policy, policy_hash=h)


def test_one_evaluator_per_policy() -> None:
    a, b = run(DENY), run(DENY)
    assert policy_of(a) is policy_of(b)
    other = run({"rules": []})
    assert policy_of(other) is not policy_of(a)
    assert policy_of(other).rule_ids == ()


def test_runs_without_a_hash_are_not_shared() -> None:
    x, y = run(DENY, ""), run({"rules": []}, "")
    assert policy_of(x).rule_ids == ("d",)
    assert policy_of(y).rule_ids == ()
