from __future__ import annotations

from typing import Any

import pytest

from orchestrator_core.replay import (
    EngineIdentity,
    RecordedReplica,
    RecordedStream,
    RecordedToken,
    StepKey,
    StreamComparator,
    StrictReplayMismatch,
    material_policy_hash,
    recorded_stream,
    run_mismatches,
    step_differences,
)

IDENT = EngineIdentity(engine="sim", engine_version="1.0", model_hash="sha256:aa")
REPLICA = RecordedReplica(pool_id="p", replica_id="r1", identity=IDENT)


def _stream(*texts: str, stop: str = "eos") -> RecordedStream:
    return RecordedStream(
        tokens=tuple(RecordedToken(t, i) for i, t in enumerate(texts)), stop_reason=stop
    )


def _mismatches(**over: object) -> list[dict[str, object]]:
    args: dict[str, object] = {
        "recorded_flow": "flow_a",
        "requested_flow": "flow_a",
        "recorded_seed": 1,
        "requested_seed": 1,
        "recorded_policy": {},
        "requested_policy": {},
        "recorded_replicas": [REPLICA],
        "current": {("p", "r1"): IDENT},
    }
    args.update(over)
    return run_mismatches(**args)  # type: ignore[arg-type]


def test_identical_inputs_have_no_mismatch() -> None:
    assert _mismatches() == []


def test_every_difference_is_listed() -> None:
    out = _mismatches(
        requested_seed=2,
        requested_flow="flow_b",
        requested_policy={"rules": [{"id": "m", "effect": "redact", "pattern": "x"}]},
        current={
            ("p", "r1"): EngineIdentity(engine="sim", engine_version="2.0", model_hash="sha256:bb")
        },
    )
    assert [m["input"] for m in out] == ["flow", "seed", "policy", "engine_version", "model_hash"]
    assert out[3] == {
        "input": "engine_version",
        "pool_id": "p",
        "replica_id": "r1",
        "recorded": "1.0",
        "current": "2.0",
    }


def test_a_missing_replica_is_a_mismatch() -> None:
    out = _mismatches(current={("p", "r2"): IDENT})
    assert out == [
        {"input": "replica", "pool_id": "p", "replica_id": "r1", "recorded": "r1", "current": None}
    ]


def test_only_redact_rules_are_material_to_output() -> None:
    deny = {"rules": [{"id": "d", "effect": "deny", "match": {"tool": "rm"}}]}
    allow = {"rules": [{"id": "a", "effect": "allow"}]}
    assert material_policy_hash(deny) == material_policy_hash(allow) == material_policy_hash({})
    redact = {"rules": [{"id": "r", "effect": "redact", "pattern": "k"}]}
    renamed = {"rules": [{"id": "other-name", "effect": "redact", "pattern": "k"}]}
    assert material_policy_hash(redact) == material_policy_hash(renamed)
    assert material_policy_hash(redact) != material_policy_hash({})
    assert _mismatches(requested_policy=deny) == []


def test_the_error_names_the_inputs() -> None:
    err = StrictReplayMismatch(_mismatches(requested_seed=3))
    assert err.code == "STRICT_REPLAY_MISMATCH"
    assert "seed" in err.message and err.details["mismatches"][0]["input"] == "seed"


def test_step_differences_name_each_input() -> None:
    key = StepKey(type="llm_call", prompt_hash="h1", params_hash="p1", model=None, seed=1)
    other = StepKey(type="llm_call", prompt_hash="h2", params_hash="p1", model="m", seed=1)
    assert step_differences(key, key) == []
    assert step_differences(key, other) == [
        {"input": "prompt_hash", "recorded": "h1", "submitted": "h2"},
        {"input": "model", "recorded": None, "submitted": "m"},
    ]


def test_comparator_accepts_the_same_stream() -> None:
    comp = StreamComparator(_stream("a", "b", "c"))
    for i, t in enumerate("abc"):
        assert comp.push(t, i) is None
    assert comp.finish("eos") is None


def test_comparator_reports_a_different_token_with_context() -> None:
    comp = StreamComparator(_stream(*"abcdefghijkl"))
    for i, t in enumerate("abcdefg"):
        assert comp.push(t, i) is None
    div = comp.push("X", 7)
    assert div is not None
    assert div.as_dict() == {
        "token_index": 7,
        "expected": {"t": "h", "token_id": 7},
        "actual": {"t": "X", "token_id": 7},
        "context": {"before": list("cdefg"), "expected_after": list("ijkl")},
    }
    assert comp.push("i", 8) is div  # the first difference sticks
    assert comp.finish("eos") is div
    assert "token 7" in div.describe() and "'X'" in div.describe()


def test_a_different_token_id_alone_diverges() -> None:
    comp = StreamComparator(_stream("a"))
    div = comp.push("a", 99)
    assert div is not None and div.expected == {"t": "a", "token_id": 0}


def test_comparator_reports_early_and_late_ends() -> None:
    early = StreamComparator(_stream("a", "b"))
    early.push("a", 0)
    div = early.finish("eos")
    assert div is not None and div.token_index == 1
    assert div.expected == {"t": "b", "token_id": 1} and div.actual == {"end": "eos"}
    late = StreamComparator(_stream("a"))
    late.push("a", 0)
    div = late.push("b", 1)
    assert div is not None and div.expected == {"end": "eos"}
    other_stop = StreamComparator(_stream("a", stop="length"))
    other_stop.push("a", 0)
    div = other_stop.finish("stop")
    assert div is not None and div.expected == {"end": "length"} and div.actual == {"end": "stop"}


def test_errors_compare_by_code() -> None:
    rec = RecordedStream(
        tokens=(RecordedToken("a", 0),), stop_reason=None, error_code="ENGINE_ERROR"
    )
    same = StreamComparator(rec)
    same.push("a", 0)
    assert same.finish(None, "ENGINE_ERROR") is None
    other = StreamComparator(rec)
    other.push("a", 0)
    div = other.finish("eos")
    assert div is not None and div.expected == {"error": "ENGINE_ERROR"}


@pytest.mark.parametrize("stop", ["cancelled", "budget"])
def test_timing_stops_cap_the_rerun(stop: str) -> None:
    comp = StreamComparator(_stream("a", "b", stop=stop))
    assert comp.cap == 2 and not comp.at_cap
    comp.push("a", 0)
    comp.push("b", 1)
    assert comp.at_cap
    assert StreamComparator(_stream("a", stop="eos")).cap is None


def test_recorded_stream_from_events() -> None:
    events: list[dict[str, Any]] = [
        {"type": "started"},
        {"type": "token", "t": "x", "token_id": 3},
        {"type": "token", "t": "y", "token_id": None},
        {"type": "end", "stop_reason": "length"},
    ]
    rec = recorded_stream(events)
    assert rec.tokens == (RecordedToken("x", 3), RecordedToken("y", None))
    assert rec.end == {"end": "length"}
    assert recorded_stream([{"type": "error", "code": "E"}]).end == {"error": "E"}


def test_streamed_logprobs_are_compared_too() -> None:
    rec = RecordedStream(tokens=(RecordedToken("a", 1, -0.25),), stop_reason="eos")
    assert StreamComparator(rec).push("a", 1, -0.25) is None
    div = StreamComparator(rec).push("a", 1, -0.2500001)
    assert div is not None
    assert div.expected == {"t": "a", "token_id": 1, "logprob": -0.25}
    assert div.actual == {"t": "a", "token_id": 1, "logprob": -0.2500001}
    events = [{"type": "token", "t": "a", "token_id": 1, "logprob": -0.25}]
    assert recorded_stream(events).tokens == rec.tokens
