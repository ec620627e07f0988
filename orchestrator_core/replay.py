"""Replay rules: what must be equal for a replay, and where a re-run stream first differs.

Three questions, answered without I/O:

- ``run_mismatches``: may a ``strict_replay`` run start? Every determinism input of the
  recorded run (flow, seed, engine, engine version, model hash, the replicas its steps ran
  on, the policy material to output) is compared with what the service has now; each difference is
  listed, so a CI job sees all of them at once. ``seedless_mismatches`` adds the engines
  that cannot take the seed: a recorded step that sampled (temperature above 0) on a pool
  whose engine does not report the ``seed`` feature cannot be reproduced there, so the run
  is refused naming the pool, its engine and the step; greedy steps (temperature 0) replay
  on any engine, and a pool whose engine has not reported its features is not refused.
- ``step_differences``: does a submitted step match the recorded step at its position (type,
  prompt hash, params hash, model, seed)?
- ``StreamComparator``: fed the re-run stream token by token, it reports the first token
  whose text or id differs from the record (or an early, late or different end) as a
  ``Divergence`` with a few tokens of context.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator_core.canonical import sha256_of
from orchestrator_core.errors import OrchestratorError
from orchestrator_core.placement import SEED

# Tokens of context around a divergence, on each side.
CONTEXT_TOKENS = 5
# Recorded stops that depend on timing (a cancel, a wall-clock or cost deadline) rather than
# on the tokens: a strict replay stops at the same token and reports the same reason.
TIMING_STOPS = frozenset({"cancelled", "budget"})


class StrictReplayMismatch(OrchestratorError):
    code = "STRICT_REPLAY_MISMATCH"

    def __init__(self, mismatches: list[dict[str, Any]]) -> None:
        names = ", ".join(sorted({m["input"] for m in mismatches}))
        said = "; ".join(str(m["message"]) for m in mismatches if m.get("message"))
        super().__init__(
            f"strict_replay refused: determinism inputs differ from the recorded run ({names})"
            + (f": {said}" if said else ""),
            details={"mismatches": mismatches},
        )


class ReplayMiss(OrchestratorError):
    """A replay step has no equal recorded step at its position (a step error, not HTTP)."""

    code = "REPLAY_MISS"


class ReplayDiverged(OrchestratorError):
    """A strict_replay step's stream differs from the record (a step error, not HTTP)."""

    code = "REPLAY_DIVERGED"


def material_policy(policy: dict[str, Any]) -> list[dict[str, Any]]:
    """The part of a policy that can change output: its redact rules, in order.

    Allow and deny rules decide whether a step runs, not what it produces; a redact rule
    rewrites prompts and tokens, so it is a determinism input.
    """
    return [
        {"match": rule.get("match") or {}, "pattern": rule.get("pattern")}
        for rule in policy.get("rules", [])
        if rule.get("effect") == "redact"
    ]


def material_policy_hash(policy: dict[str, Any]) -> str:
    return sha256_of(material_policy(policy))


@dataclass(frozen=True)
class EngineIdentity:
    """What a replica is: the fields of provenance that name the engine and the weights."""

    engine: str | None
    engine_version: str | None
    model_hash: str | None


@dataclass(frozen=True)
class RecordedReplica:
    pool_id: str
    replica_id: str
    identity: EngineIdentity


def run_mismatches(
    *,
    recorded_flow: str,
    requested_flow: str,
    recorded_seed: int,
    requested_seed: int,
    recorded_policy: dict[str, Any],
    requested_policy: dict[str, Any],
    recorded_replicas: Iterable[RecordedReplica],
    current: dict[tuple[str, str], EngineIdentity],
) -> list[dict[str, Any]]:
    """Every determinism input of a strict replay that differs; empty when it may start.

    ``current`` maps (pool_id, replica_id) of the replicas this service has to what they run.
    """
    out: list[dict[str, Any]] = []
    if recorded_flow != requested_flow:
        out.append({"input": "flow", "recorded": recorded_flow, "current": requested_flow})
    if recorded_seed != requested_seed:
        out.append({"input": "seed", "recorded": recorded_seed, "current": requested_seed})
    rec_policy, req_policy = material_policy(recorded_policy), material_policy(requested_policy)
    if rec_policy != req_policy:
        out.append(
            {
                "input": "policy",
                "recorded": sha256_of(rec_policy),
                "current": sha256_of(req_policy),
                "message": "redact rules differ (they change prompts and tokens)",
            }
        )
    for rec in sorted(recorded_replicas, key=lambda r: (r.pool_id, r.replica_id)):
        where = {"pool_id": rec.pool_id, "replica_id": rec.replica_id}
        now = current.get((rec.pool_id, rec.replica_id))
        if now is None:
            out.append({"input": "replica", **where, "recorded": rec.replica_id, "current": None})
            continue
        for name in ("engine", "engine_version", "model_hash"):
            was, is_ = getattr(rec.identity, name), getattr(now, name)
            if was != is_:
                out.append({"input": name, **where, "recorded": was, "current": is_})
    return out


@dataclass(frozen=True)
class RecordedSample:
    """A recorded engine step that sampled (temperature above 0): its tokens depend on the
    seed, so only an engine that takes one can give them again."""

    step_id: str
    pool_id: str
    replica_id: str
    temperature: float


def seedless_mismatches(
    *,
    recorded_seed: int,
    sampled: Iterable[RecordedSample],
    features: Mapping[str, frozenset[str] | None],
    engines: Mapping[tuple[str, str], str | None],
) -> list[dict[str, Any]]:
    """A ``seed`` mismatch for each pool where a recorded step sampled and whose engine, as it
    reports now (``features`` by pool id), takes no seed; it names the first such step of
    ``sampled`` (in the recorded order). A pool whose features are not known yet (None) is not
    refused, nor a pool or replica this service no longer has (``run_mismatches`` refuses a
    missing replica). ``engines``: the engine each (pool_id, replica_id) here runs."""
    out: list[dict[str, Any]] = []
    refused: set[str] = set()
    for step in sampled:
        told = features.get(step.pool_id)
        where = (step.pool_id, step.replica_id)
        if step.pool_id in refused or told is None or SEED in told or where not in engines:
            continue
        refused.add(step.pool_id)
        engine = engines[where]
        out.append(
            {
                "input": "seed",
                "pool_id": step.pool_id,
                "replica_id": step.replica_id,
                "recorded": recorded_seed,
                "current": None,
                "engine": engine,
                "step_id": step.step_id,
                "temperature": step.temperature,
                "message": (
                    f"strict_replay needs a seeded engine: pool {step.pool_id!r} (engine"
                    f" {engine}) has no seed, and step {step.step_id} sampled (temperature"
                    f" {step.temperature:g})"
                ),
            }
        )
    return out


@dataclass(frozen=True)
class StepKey:
    """The inputs that decide a step's output, as a replay matches them."""

    type: str
    prompt_hash: str
    params_hash: str
    model: str | None
    seed: int


def step_differences(recorded: StepKey, submitted: StepKey) -> list[dict[str, Any]]:
    return [
        {"input": name, "recorded": getattr(recorded, name), "submitted": getattr(submitted, name)}
        for name in ("type", "prompt_hash", "params_hash", "model", "seed")
        if getattr(recorded, name) != getattr(submitted, name)
    ]


@dataclass(frozen=True)
class RecordedToken:
    t: str
    token_id: int | None
    logprob: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t, "token_id": self.token_id}
        if self.logprob is not None:
            out["logprob"] = self.logprob
        return out


@dataclass(frozen=True)
class RecordedStream:
    """A recorded step's tokens and how it ended (``stop_reason``, or ``error`` code)."""

    tokens: tuple[RecordedToken, ...]
    stop_reason: str | None
    error_code: str | None = None

    @property
    def end(self) -> dict[str, Any]:
        if self.error_code is not None:
            return {"error": self.error_code}
        return {"end": self.stop_reason}

    @property
    def timing_stop(self) -> bool:
        return self.error_code is None and self.stop_reason in TIMING_STOPS


@dataclass(frozen=True)
class Divergence:
    token_index: int
    expected: dict[str, Any]
    actual: dict[str, Any]
    before: tuple[str, ...]
    expected_after: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "token_index": self.token_index,
            "expected": self.expected,
            "actual": self.actual,
            "context": {"before": list(self.before), "expected_after": list(self.expected_after)},
        }

    def describe(self) -> str:
        return (
            f"token {self.token_index}: expected {_show(self.expected)}, got {_show(self.actual)}"
        )


def _show(item: dict[str, Any]) -> str:
    if "t" in item:
        return f"{item['t']!r} (id {item['token_id']})"
    if "end" in item:
        return f"end ({item['end']})"
    return f"error ({item['error']})"


@dataclass
class StreamComparator:
    """Compares a re-run stream with the record as it arrives; the first difference sticks."""

    recorded: RecordedStream
    seen: int = 0
    divergence: Divergence | None = field(default=None)

    @property
    def cap(self) -> int | None:
        """Stop the re-run after this many tokens (the record stopped there for timing)."""
        return len(self.recorded.tokens) if self.recorded.timing_stop else None

    @property
    def at_cap(self) -> bool:
        cap = self.cap
        return cap is not None and self.seen >= cap

    def push(
        self, text: str, token_id: int | None, logprob: float | None = None
    ) -> Divergence | None:
        """Compare the next token (text, id and, when streamed, logprob); returns the
        divergence when this one differs."""
        if self.divergence is not None:
            return self.divergence
        actual = RecordedToken(text, token_id, logprob)
        tokens = self.recorded.tokens
        if self.seen >= len(tokens):
            return self._diverge(self.recorded.end, actual.as_dict())
        expected = tokens[self.seen]
        if expected != actual:
            return self._diverge(expected.as_dict(), actual.as_dict())
        self.seen += 1
        return None

    def finish(self, stop_reason: str | None, error_code: str | None = None) -> Divergence | None:
        """Compare the end: the same number of tokens, and the same stop reason or error."""
        if self.divergence is not None:
            return self.divergence
        actual = {"error": error_code} if error_code is not None else {"end": stop_reason}
        tokens = self.recorded.tokens
        if self.seen < len(tokens):
            return self._diverge(tokens[self.seen].as_dict(), actual)
        if actual != self.recorded.end:
            return self._diverge(self.recorded.end, actual)
        return None

    def _diverge(self, expected: dict[str, Any], actual: dict[str, Any]) -> Divergence:
        tokens = self.recorded.tokens
        i = self.seen
        self.divergence = Divergence(
            token_index=i,
            expected=expected,
            actual=actual,
            before=tuple(t.t for t in tokens[max(0, i - CONTEXT_TOKENS) : i]),
            expected_after=tuple(t.t for t in tokens[i + 1 : i + 1 + CONTEXT_TOKENS]),
        )
        return self.divergence


def recorded_stream(events: Sequence[dict[str, Any]]) -> RecordedStream:
    """Build the record from a step's decoded events (in seq order)."""
    tokens: list[RecordedToken] = []
    stop_reason: str | None = None
    error_code: str | None = None
    for ev in events:
        if ev["type"] == "token":
            tokens.append(
                RecordedToken(t=ev["t"], token_id=ev.get("token_id"), logprob=ev.get("logprob"))
            )
        elif ev["type"] == "end":
            stop_reason = ev["stop_reason"]
        elif ev["type"] == "error":
            error_code = ev["code"]
    return RecordedStream(tokens=tuple(tokens), stop_reason=stop_reason, error_code=error_code)
