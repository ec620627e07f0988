"""Canonical JSON and content hashes (orchestrator_core.canonical)."""

from __future__ import annotations

import copy
import hashlib
import math
from typing import Any

import pytest

from orchestrator_core.canonical import canonical_json, normalize, sha256_bytes, sha256_of
from orchestrator_core.errors import InvalidParams

# The pinned fixture: its canonical bytes are written out by hand and its hash pinned, so a
# change of the canonical form (which would change every stored flow id) is caught.
FIXED_OBJECT: dict[str, Any] = {"b": [1, 2.0, "x"], "a": None, "c": {"d": True}}
FIXED_BYTES = b'{"a":null,"b":[1,2,"x"],"c":{"d":true}}'
FIXED_HASH = "sha256:4cf502c30907ac70ece3b2d0c727737a91955daa6af88704762ee41e3bd6aff2"


def _field_of(exc: InvalidParams) -> str:
    assert exc.code == "INVALID_PARAMS"
    assert exc.retriable is False
    [error] = exc.details["errors"]
    assert error["field"] == exc.field
    return exc.field


# --- pinned values ---------------------------------------------------------------------------


def test_fixed_object_canonical_bytes() -> None:
    assert canonical_json(FIXED_OBJECT) == FIXED_BYTES


def test_fixed_object_hash_is_pinned() -> None:
    assert sha256_of(FIXED_OBJECT) == FIXED_HASH
    assert "sha256:" + hashlib.sha256(FIXED_BYTES).hexdigest() == FIXED_HASH


def test_hash_format() -> None:
    digest = sha256_of({"x": 1})
    prefix, hexpart = digest.split(":")
    assert prefix == "sha256"
    assert len(hexpart) == 64
    assert int(hexpart, 16) >= 0
    assert hexpart == hexpart.lower()


def test_sha256_bytes() -> None:
    assert sha256_bytes(b"") == (
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert sha256_bytes(FIXED_BYTES) == FIXED_HASH


def test_sha256_of_equals_sha256_bytes_of_canonical_json() -> None:
    value = {"z": [1.5, "é"], "a": {"k": False}}
    assert sha256_of(value) == sha256_bytes(canonical_json(value))


# --- key order and whitespace ----------------------------------------------------------------


def test_key_order_is_irrelevant() -> None:
    a = {"a": 1, "b": 2, "c": {"x": [1, 2], "y": None}}
    b = {"c": {"y": None, "x": [1, 2]}, "b": 2, "a": 1}
    assert canonical_json(a) == canonical_json(b)
    assert sha256_of(a) == sha256_of(b)


def test_keys_sorted_at_every_level() -> None:
    value = {"b": {"z": 1, "a": 2}, "a": [{"d": 1, "c": 2}]}
    assert canonical_json(value) == b'{"a":[{"c":2,"d":1}],"b":{"a":2,"z":1}}'


def test_keys_sorted_by_code_point() -> None:
    value = {"a": 1, "Z": 2, "\u00e9": 3, "\U00010000": 4, "\uffff": 5, "_": 6, "1": 7}
    out = canonical_json(value).decode()
    keys_in_order = ["1", "Z", "_", "a", "\u00e9", "\uffff", "\U00010000"]
    positions = [out.index(f'"{k}"') for k in keys_in_order]
    assert positions == sorted(positions)


def test_no_insignificant_whitespace() -> None:
    assert canonical_json({"a": [1, 2], "b": {"c": "d e"}}) == b'{"a":[1,2],"b":{"c":"d e"}}'


def test_list_order_is_material() -> None:
    assert sha256_of([1, 2]) != sha256_of([2, 1])


def test_tuple_is_a_list() -> None:
    assert canonical_json((1, (2, 3))) == canonical_json([1, [2, 3]]) == b"[1,[2,3]]"


# --- Unicode -----------------------------------------------------------------------------------


def test_nfc_strings_hash_equal() -> None:
    decomposed = "e\u0301"
    composed = "\u00e9"
    assert decomposed != composed
    assert sha256_of(decomposed) == sha256_of(composed)
    assert sha256_of({"v": ["caf" + decomposed]}) == sha256_of({"v": ["caf" + composed]})
    assert canonical_json(decomposed) == '"\u00e9"'.encode()


def test_nfc_keys_hash_equal() -> None:
    assert sha256_of({"e\u0301": 1}) == sha256_of({"\u00e9": 1})
    assert normalize({"e\u0301": 1}) == {"\u00e9": 1}


def test_keys_equal_after_nfc_refused() -> None:
    with pytest.raises(InvalidParams) as info:
        normalize({"x": {"e\u0301": 1, "\u00e9": 2}})
    assert _field_of(info.value) == "$.x"


def test_non_ascii_written_as_utf8() -> None:
    assert canonical_json("日本") == '"日本"'.encode()


def test_different_strings_hash_differently() -> None:
    assert sha256_of("a") != sha256_of("b")
    assert sha256_of("a") != sha256_of("a ")


# --- numbers -----------------------------------------------------------------------------------


def test_integral_float_is_int() -> None:
    assert canonical_json(1.0) == canonical_json(1) == b"1"
    assert sha256_of({"n": 1.0}) == sha256_of({"n": 1})
    assert sha256_of([0.0, -3.0]) == sha256_of([0, -3])
    assert isinstance(normalize(2.0), int)


def test_negative_zero_is_zero() -> None:
    assert canonical_json(-0.0) == b"0"


def test_non_integral_float_kept() -> None:
    assert normalize(2.5) == 2.5
    assert isinstance(normalize(2.5), float)
    assert canonical_json(2.5) == b"2.5"
    assert sha256_of(2.5) != sha256_of(2)


def test_bool_is_not_int() -> None:
    assert canonical_json(True) == b"true"
    assert canonical_json(False) == b"false"
    assert sha256_of(True) != sha256_of(1)
    assert sha256_of(False) != sha256_of(0)
    assert normalize(True) is True


def test_none_is_null() -> None:
    assert canonical_json(None) == b"null"
    assert canonical_json({"a": None}) == b'{"a":null}'


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_refused_at_root(bad: float) -> None:
    with pytest.raises(InvalidParams) as info:
        canonical_json(bad)
    assert _field_of(info.value) == "$"


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"a": math.nan}, "$.a"),
        ({"a": {"b": [1, math.inf]}}, "$.a.b[1]"),
        ([0, [1, 2, -math.inf]], "$[1][2]"),
        ({"e\u0301": [math.nan]}, "$.\u00e9[0]"),
    ],
)
def test_non_finite_refused_naming_the_path(value: Any, field: str) -> None:
    with pytest.raises(InvalidParams) as info:
        sha256_of(value)
    assert _field_of(info.value) == field
    assert field in str(info.value)


def test_normalize_path_argument_is_the_root_name() -> None:
    with pytest.raises(InvalidParams) as info:
        normalize({"x": math.nan}, "config")
    assert _field_of(info.value) == "config.x"


# --- refused types -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({1: "a"}, "$"),
        ({None: "a"}, "$"),
        ({(1, 2): "a"}, "$"),
        ({"ok": {2.5: "a"}}, "$.ok"),
        ([{"a": 1}, {True: 1}], "$[1]"),
    ],
)
def test_non_str_keys_refused(value: Any, field: str) -> None:
    with pytest.raises(InvalidParams) as info:
        canonical_json(value)
    assert _field_of(info.value) == field


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({1, 2}, "$"),
        (b"bytes", "$"),
        ({"a": object()}, "$.a"),
        ([1, {"b": frozenset()}], "$[1].b"),
    ],
)
def test_non_json_types_refused(value: Any, field: str) -> None:
    with pytest.raises(InvalidParams) as info:
        canonical_json(value)
    assert _field_of(info.value) == field


# --- purity ------------------------------------------------------------------------------------


def test_normalize_does_not_mutate_input() -> None:
    value = {"b": ["e\u0301", 1.0], "a": {"e\u0301": 2.0}}
    before = copy.deepcopy(value)
    normalize(value)
    canonical_json(value)
    assert value == before


def test_normalize_is_idempotent() -> None:
    value = {"b": ["e\u0301", 1.0, (1, 2)], "a": {"e\u0301": 2.5}}
    once = normalize(value)
    assert normalize(once) == once
    assert canonical_json(once) == canonical_json(value)


# --- known bugs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{"n": 2**64}, {"n": -(2**63) - 1}, {"n": 10**30}, {"s": "\ud800"}],
    ids=["2**64", "-2**63-1", "10**30", "lone-surrogate"],
)
def test_unencodable_values_give_invalid_params_or_a_hash(value: dict[str, Any]) -> None:
    outcome: str | InvalidParams
    try:
        outcome = sha256_of(value)
    except InvalidParams as exc:  # refusing it is fine, as long as it names the field
        outcome = exc
    if isinstance(outcome, InvalidParams):
        assert outcome.field in ("$.n", "$.s")
    else:
        assert outcome.startswith("sha256:")
