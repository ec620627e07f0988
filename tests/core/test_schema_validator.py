"""The validator client schemas run on (orchestrator_core.schemas.validator): the keywords it
replaces agree with jsonschema's wherever both can run, and what it bounds is bounded."""

from __future__ import annotations

import random
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import referencing.exceptions
from jsonschema import Draft202012Validator

from orchestrator_core.schemas import bounds
from orchestrator_core.schemas.bounds import ValidationBound, ValidationTimeout, deadline
from orchestrator_core.schemas.validator import validator_for

SCHEMAS: list[dict[str, Any]] = [
    {"pattern": "^a[0-9]+$"},
    {"patternProperties": {"^x_": {"type": "integer"}, "b$": {"type": "string"}}},
    {"properties": {"a": {}}, "patternProperties": {"^x": {}}, "additionalProperties": False},
    {"patternProperties": {"^x": {}}, "additionalProperties": False},
    {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
    {"allOf": [{"properties": {"a": {}}}, {"patternProperties": {"^x": {}}}],
     "unevaluatedProperties": False},
    {"anyOf": [{"properties": {"a": {"type": "integer"}}}, {"patternProperties": {"b": {}}}],
     "unevaluatedProperties": {"type": "string"}},
    {"$ref": "#/$defs/o", "$defs": {"o": {"patternProperties": {"^k": {}}}},
     "unevaluatedProperties": False},
    {"if": {"required": ["a"]}, "then": {"properties": {"b": {}}},
     "else": {"patternProperties": {"c": {}}}, "unevaluatedProperties": False},
    {"dependentSchemas": {"a": {"properties": {"b": {}}}}, "unevaluatedProperties": False},
    {"uniqueItems": True},
    {"items": {"uniqueItems": True}},
]  # fmt: skip

_KEYS = ["a", "b", "x_1", "xb", "c", "k9", "ab"]
_VALUES: list[Any] = [0, 1, 1.0, True, False, None, "a1", "s", [], [1], [1.0], {}, {"a": 1}]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 2 and roll < 0.35:
        return {rng.choice(_KEYS): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 2 and roll < 0.6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return rng.choice([*_VALUES, "a" + str(rng.randint(0, 99))])


def _errors(validator: Any, value: Any) -> list[tuple[str, str, str]]:
    return sorted(
        (e.validator, "/".join(map(str, e.absolute_path)), e.message)
        for e in validator.iter_errors(value)
    )


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_the_replaced_keywords_agree_with_jsonschema(index: int) -> None:
    schema = SCHEMAS[index]
    ours, theirs = validator_for(schema), Draft202012Validator(schema)
    rng = random.Random(index)
    for _ in range(300):
        value = _random_value(rng)
        assert _errors(ours, value) == _errors(theirs, value), (schema, value)


@pytest.mark.parametrize(
    ("items", "unique"),
    [
        ([1, 1.0], False),  # JSON numbers: equal
        ([1, True], True),  # a boolean is not a number
        ([0, False], True),
        ([{"a": [1, {"b": 2}]}, {"a": [1.0, {"b": 2.0}]}], False),
        ([{"a": 1}, {"a": 1, "b": 2}], True),
        ([[1, 2], [2, 1]], True),
        ([None, None], False),
        ([{"a": True}, {"a": 1}], True),
    ],
)
def test_unique_items_is_json_equality(items: list[Any], unique: bool) -> None:
    assert validator_for({"uniqueItems": True}).is_valid(items) is unique
    assert Draft202012Validator({"uniqueItems": True}).is_valid(items) is unique


def test_the_catastrophic_pattern_fails_to_match() -> None:
    validator = validator_for({"pattern": "^(a+)+$"})
    assert not validator.is_valid("a" * 10_000 + "b")
    assert validator.is_valid("a" * 10_000)


@pytest.fixture
def small_deadline() -> Iterator[None]:
    was = bounds.current()
    bounds.configure(ValidationBound(deadline_s=0.001))
    yield
    bounds.configure(was)


def test_a_string_too_long_for_its_pattern_within_the_deadline_is_an_error(
    small_deadline: None,
) -> None:
    # 0.001 s fits about 16,000 steps: 1,000 characters against a 20-instruction program do
    schema = {"pattern": "[ab]*a[ab]{14}c"}
    [error] = validator_for(schema).iter_errors("ab" * 500)
    assert error.message.startswith("is 1000 characters, too long to be checked against")
    assert validator_for(schema).is_valid("ab" * 5 + "a" * 15 + "c")


def test_a_key_too_long_for_a_pattern_is_an_error_at_the_key(small_deadline: None) -> None:
    schema: dict[str, Any] = {"patternProperties": {"[ab]*a[ab]{14}c": {}}}
    [error] = validator_for(schema).iter_errors({"ab" * 500: 1})
    assert list(error.absolute_path) == ["ab" * 500]


def test_the_validator_gives_up_at_its_deadline() -> None:
    schema = {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}
    with deadline(-1.0), pytest.raises(ValidationTimeout):
        validator_for(schema).is_valid([1, 2, 3])
    assert validator_for(schema).is_valid([1, 2, 3])


def test_no_reference_is_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    # stored before the rules refused it: jsonschema's default registry would urlopen it
    fetched: list[Any] = []

    def fetch(*args: Any, **kwargs: Any) -> Any:
        fetched.append(args)
        raise OSError("no network here")

    monkeypatch.setattr(urllib.request, "urlopen", fetch)
    with pytest.raises(referencing.exceptions.Unresolvable):
        validator_for({"$ref": "http://127.0.0.1:9/schema"}).is_valid(1)
    assert fetched == []
    with pytest.raises(referencing.exceptions.Unresolvable):  # what jsonschema alone does
        Draft202012Validator({"$ref": "http://127.0.0.1:9/schema"}).is_valid(1)
    assert len(fetched) == 1


def test_a_pattern_re2_cannot_run_is_an_error_not_a_crash() -> None:
    # a schema stored before RE2 judged its patterns
    [error] = validator_for({"pattern": "(?=a)"}).iter_errors("a")
    assert "cannot run on RE2" in error.message
