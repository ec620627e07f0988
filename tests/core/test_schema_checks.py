"""A value checked against a client schema (orchestrator_core.schemas.bounds, cost, instance):
the error list is capped and the rest counted, the deadline ends a check, and a costly check
is handed to the caller to run elsewhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator_core import clock
from orchestrator_core.errors import InvalidParams, TooLarge, ToolArgsInvalid
from orchestrator_core.regexes import re2_regex
from orchestrator_core.schemas import bounds
from orchestrator_core.schemas.bounds import (
    ValidationBound,
    ValidationDeferred,
    bounded_call,
    deferring,
)
from orchestrator_core.schemas.cost import Weight, checked, work_of
from orchestrator_core.schemas.instance import check_data, within_regex_bound
from orchestrator_core.tools import check_args

CLOSED = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}


class TickingClock(clock.Clock):
    """Each reading is a millisecond after the last: the deadline comes after so many checks."""

    def __init__(self) -> None:
        self._now = 0.0

    def monotonic(self) -> float:
        self._now += 0.001
        return self._now


@pytest.fixture
def bound() -> Iterator[None]:
    was = bounds.current()
    yield
    bounds.configure(was)


@pytest.fixture
def ticking() -> Iterator[None]:
    was = clock.set_clock(TickingClock())
    yield
    clock.set_clock(was)


def test_at_most_max_errors_are_listed_and_the_rest_counted(bound: None) -> None:
    bounds.configure(ValidationBound(max_errors=100))
    args = {f"k{i}": i for i in range(20_000)}
    with pytest.raises(ToolArgsInvalid) as info:
        check_args("t", CLOSED, args)
    details = info.value.details
    assert len(details["errors"]) == 100
    assert details["errors_not_listed"] == 19_900
    assert details["errors_cut_short"] is False
    assert info.value.message.endswith("is not allowed (and 19999 more)")


def test_a_whole_list_adds_nothing(bound: None) -> None:
    bounds.configure(ValidationBound(max_errors=5))
    with pytest.raises(ToolArgsInvalid) as info:
        check_args("t", CLOSED, {"x": 1, "y": 2})
    assert set(info.value.details) == {"tool", "field", "errors"}
    assert info.value.message.endswith("(and 1 more)")


def test_the_cap_is_the_setting(bound: None) -> None:
    bounds.configure(ValidationBound(max_errors=3))
    with pytest.raises(ToolArgsInvalid) as info:
        check_args("t", CLOSED, {f"k{i}": i for i in range(10)})
    assert len(info.value.details["errors"]) == 3
    assert info.value.details["errors_not_listed"] == 7


def test_counting_stops_at_the_deadline_and_says_so(bound: None, ticking: None) -> None:
    bounds.configure(ValidationBound(deadline_s=2.0, max_errors=100))
    schema = {"items": {"anyOf": [{"type": "integer"}]}}  # one deadline check per item
    with pytest.raises(ToolArgsInvalid) as info:
        check_args("t", schema, ["x"] * 5_000)
    details = info.value.details
    assert len(details["errors"]) == 100
    assert details["errors_cut_short"] is True
    assert 0 < details["errors_not_listed"] < 4_900
    assert "(and at least" in info.value.message


def test_a_check_past_the_deadline_before_any_error_is_413(bound: None, ticking: None) -> None:
    bounds.configure(ValidationBound(deadline_s=0.5))
    schema = {"items": {"anyOf": [{"type": "integer"}]}}
    with pytest.raises(TooLarge) as info:
        check_args("t", schema, list(range(5_000)))
    assert info.value.details["limit"] == "validation.deadline_s"
    assert info.value.details["field"] == "input.args"


def test_fact_data_errors_are_capped_and_named(bound: None) -> None:
    bounds.configure(ValidationBound(max_errors=2))
    with pytest.raises(InvalidParams) as info:
        check_data({"items": {"type": "integer"}}, ["a", "b", "c", "d"])
    details = info.value.details
    assert [e["field"] for e in details["errors"]] == ["data.0", "data.1"]
    assert details["errors_not_listed"] == 2


def test_a_string_too_long_to_redact_within_the_deadline_is_413(bound: None) -> None:
    bounds.configure(ValidationBound(deadline_s=0.001))  # about 16,000 regex steps
    patterns = [re2_regex("[ab]*a[ab]{14}c")]  # 21 instructions
    within_regex_bound({"a": ["x" * 500]}, patterns, field="data")
    with pytest.raises(TooLarge) as info:
        within_regex_bound({"a": ["x" * 1_000]}, patterns, field="data")
    assert info.value.details["field"] == "data"


# --- where a check runs ------------------------------------------------------------------------


def _never() -> float:
    raise AssertionError("work is not reckoned outside deferring")


def test_outside_deferring_a_check_runs_here() -> None:
    assert bounded_call(b"k", 1, _never, lambda: "ran") == "ran"


def test_inside_deferring_a_costly_check_is_handed_back_and_its_result_used(bound: None) -> None:
    bounds.configure(ValidationBound(inline_max_work=10))
    with deferring(), pytest.raises(ValidationDeferred) as info:
        bounded_call(b"k", {"v": 1}, lambda: 11, lambda: "checked")
    deferred = info.value
    result = deferred.run()  # what the server does on a worker thread
    assert result == "checked"
    done = ((deferred.key, deferred.instance, result),)
    with deferring(done):  # asked again: an equal value answers without running
        assert bounded_call(b"k", {"v": 1}, _never, _fail) == "checked"
        with pytest.raises(ValidationDeferred):  # another value is another check
            bounded_call(b"k", {"v": 2}, lambda: 11, lambda: "checked")
    with deferring():  # a cheap one runs here
        assert bounded_call(b"k", {"v": 1}, lambda: 10, lambda: "here") == "here"


def _fail() -> str:
    raise AssertionError("checked again")


def test_a_schema_seen_first_is_checked_off_the_loop_then_weighed(bound: None) -> None:
    schema = {"type": "object", "properties": {"first_seen_here": {"type": "string"}}}
    with deferring(), pytest.raises(ValidationDeferred) as info:
        checked(b"t:", schema, {"first_seen_here": "x"}, lambda: "ok")
    assert info.value.run() == "ok"  # learns the schema's weight
    with deferring():
        assert checked(b"t:", schema, {"first_seen_here": "y"}, lambda: "inline") == "inline"


@pytest.mark.parametrize(
    ("value", "weight", "expected"),
    [
        ({"a": 1, "b": [1, 2]}, Weight(3, 0), 3 * 5),  # the object, its 2 values, 2 items
        ("x" * 640, Weight(1, 10), 1 + 640 * 10 / 64),
        ({"k" * 64: 1}, Weight(1, 64), 1 + 1 + 64),  # names meet patternProperties
    ],
)
def test_work(value: Any, weight: Weight, expected: float) -> None:
    assert work_of(value, weight, limit=10**9) == expected


def test_the_work_walk_stops_past_its_limit() -> None:
    assert work_of(list(range(10**6)), Weight(10, 0), limit=100) == float("inf")
