"""Properties of canonical JSON and its hashes (orchestrator_core.canonical), over generated
JSON values."""

from __future__ import annotations

import json
import math
import random
import unicodedata
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator_core.canonical import canonical_json, normalize, sha256_bytes, sha256_of
from orchestrator_core.errors import InvalidParams

PROPS = settings(max_examples=100, deadline=None)
MAX_EXACT = 2**53

nfc_text = st.text(max_size=8).map(lambda s: unicodedata.normalize("NFC", s))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | nfc_text
)
# keys already in NFC: two keys of one object stay distinct once normalized
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(nfc_text, inner, max_size=4),
    max_leaves=16,
)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON: ``True`` is not ``1`` and ``1`` is not ``1.0`` here."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def reorder(value: Any, rnd: random.Random) -> Any:
    """The same value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: reorder(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [reorder(v, rnd) for v in value]
    return value


def map_tree(value: Any, leaf: Any, key: Any = lambda k: k) -> Any:
    if isinstance(value, dict):
        return {key(k): map_tree(v, leaf, key) for k, v in value.items()}
    if isinstance(value, list):
        return [map_tree(v, leaf, key) for v in value]
    return leaf(value)


@PROPS
@given(values, st.randoms(use_true_random=False))
def test_key_order_never_changes_the_bytes(value: Any, rnd: random.Random) -> None:
    shuffled = reorder(value, rnd)
    assert canonical_json(shuffled) == canonical_json(value)
    assert sha256_of(shuffled) == sha256_of(value)


@PROPS
@given(values)
def test_the_bytes_parse_back_to_the_canonical_value(value: Any) -> None:
    data = canonical_json(value)
    tree = normalize(value)
    assert same(orjson.loads(data), tree)
    assert same(json.loads(data), tree)
    assert canonical_json(orjson.loads(data)) == data  # canonical bytes are a fixed point


@PROPS
@given(values)
def test_object_keys_come_out_sorted_by_code_point(value: Any) -> None:
    orders: list[list[str]] = []

    def record(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        orders.append([k for k, _ in pairs])
        return dict(pairs)

    json.loads(canonical_json(value), object_pairs_hook=record)
    assert all(keys == sorted(keys) for keys in orders)  # str order is code point order


@PROPS
@given(values, st.data())
def test_hashes_are_equal_exactly_when_the_bytes_are(value: Any, data: st.DataObject) -> None:
    other = data.draw(
        st.just(reorder(value, random.Random(0))) | st.just(normalize(value)) | values
    )
    same_bytes = canonical_json(value) == canonical_json(other)
    assert (sha256_of(value) == sha256_of(other)) is same_bytes
    assert same_bytes is same(normalize(value), normalize(other))
    assert sha256_of(value) == sha256_bytes(canonical_json(value))


@PROPS
@given(values)
def test_integral_floats_hash_as_integers(value: Any) -> None:
    def as_float(leaf: Any) -> Any:
        exact = isinstance(leaf, int) and not isinstance(leaf, bool) and abs(leaf) < MAX_EXACT
        return float(leaf) if exact else leaf

    assert canonical_json(map_tree(value, as_float)) == canonical_json(value)


@PROPS
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_keeps_its_value(number: float) -> None:
    parsed = orjson.loads(canonical_json(number))
    assert parsed == number
    integral = number.is_integer() and abs(number) < MAX_EXACT
    assert isinstance(parsed, int) is integral  # 1.0 and -0.0 are written as integers


@PROPS
@given(values)
def test_decomposed_text_hashes_as_composed(value: Any) -> None:
    def nfd(leaf: Any) -> Any:
        return unicodedata.normalize("NFD", leaf) if isinstance(leaf, str) else leaf

    decomposed = map_tree(value, nfd, nfd)
    assert canonical_json(decomposed) == canonical_json(value)


composable = st.lists(st.sampled_from(["é", "Å", "ñ", "ü", "가", "ḉ", "a", "-"]), min_size=1).map(
    "".join
)


@PROPS
@given(composable.filter(lambda s: unicodedata.normalize("NFD", s) != s), values)
def test_keys_that_meet_after_nfc_are_refused(key: str, item: Any) -> None:
    decomposed = unicodedata.normalize("NFD", key)
    with pytest.raises(InvalidParams) as info:
        canonical_json({"ok": {key: item, decomposed: item}})
    assert info.value.field == "$.ok"


bad_leaves = (
    st.sampled_from([math.nan, math.inf, -math.inf])
    | st.integers(min_value=2**64)
    | st.integers(max_value=-(2**63) - 1)
    | st.tuples(st.text(max_size=3), st.characters(categories=["Cs"])).map("".join)
)


@PROPS
@given(nfc_text, values, bad_leaves)
def test_what_has_no_canonical_form_is_refused_at_its_place(key: str, good: Any, bad: Any) -> None:
    with pytest.raises(InvalidParams) as info:
        canonical_json({key: [good, bad]})
    assert info.value.field == f"$.{key}[1]"
    with pytest.raises(InvalidParams):
        sha256_of([bad])
