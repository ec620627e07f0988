"""The process clock and id source (orchestrator_core.clock)."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator_core import clock as clock_mod
from orchestrator_core.clock import Clock, FrozenClock, IdSource, new_id, now, set_clock

CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"
ID_RE = re.compile(rf"^(?P<prefix>[a-z]+)_(?P<body>[{CROCKFORD}]{{26}})$")


def decode(ident: str) -> int:
    body = ident.rsplit("_", 1)[1]
    value = 0
    for ch in body:
        value = value * 32 + CROCKFORD.index(ch)
    return value


def ms_of(ident: str) -> int:
    return decode(ident) >> 80


class FakeTime:
    """Stands in for the ``time`` module inside orchestrator_core.clock."""

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def time_ns(self) -> int:
        return self.ns


@pytest.fixture
def restore_clock() -> Iterator[None]:
    original = clock_mod.clock
    yield
    set_clock(original)


# --- ids ---------------------------------------------------------------------------------------


def test_id_shape_and_prefix() -> None:
    for prefix in ["run", "step", "flow", "evt"]:
        ident = new_id(prefix)
        match = ID_RE.match(ident)
        assert match is not None, ident
        assert match["prefix"] == prefix


def test_ids_strictly_increasing_in_tight_loop() -> None:
    source = IdSource()
    generated = [source.new("x") for _ in range(5000)]
    assert len(set(generated)) == len(generated)
    assert generated == sorted(generated)
    values = [decode(i) for i in generated]
    assert all(a < b for a, b in itertools.pairwise(values))


def test_ids_strictly_increasing_within_one_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTime(1_700_000_000_123_456_789)
    monkeypatch.setattr(clock_mod, "time", fake)
    source = IdSource()
    generated = [source.new("step") for _ in range(1000)]
    assert generated == sorted(generated)
    assert len(set(generated)) == 1000
    assert {ms_of(i) for i in generated} == {1_700_000_000_123}
    randoms = [decode(i) & ((1 << 80) - 1) for i in generated]
    assert randoms == list(range(randoms[0], randoms[0] + 1000))


def test_ids_keep_increasing_when_the_wall_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeTime(2_000_000_000_000_000_000)
    monkeypatch.setattr(clock_mod, "time", fake)
    source = IdSource()
    first = source.new("x")
    fake.ns -= 5_000_000_000  # five seconds back
    second = source.new("x")
    third = source.new("x")
    assert first < second < third
    assert ms_of(second) == ms_of(first)


def test_new_millisecond_sorts_after(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTime(1_000_000_000_000_000)
    monkeypatch.setattr(clock_mod, "time", fake)
    source = IdSource()
    earlier = [source.new("x") for _ in range(50)]
    fake.ns += 1_000_000
    later = source.new("x")
    assert all(e < later for e in earlier)
    assert ms_of(later) == ms_of(earlier[0]) + 1


def test_id_timestamp_is_wall_clock_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock_mod, "time", FakeTime(1_234_567_890_999_999))
    assert ms_of(IdSource().new("x")) == 1_234_567_890


def test_ids_sort_like_creation_order_across_prefixes() -> None:
    source = IdSource()
    bodies = [source.new(p).rsplit("_", 1)[1] for p in ["b", "a", "c", "a"]]
    assert bodies == sorted(bodies)


def test_ids_unique_across_threads() -> None:
    source = IdSource()
    results: list[list[str]] = [[] for _ in range(8)]

    def work(out: list[str]) -> None:
        out.extend(source.new("t") for _ in range(500))

    threads = [threading.Thread(target=work, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for r in results for i in r]
    assert len(set(everything)) == len(everything)
    for r in results:
        assert r == sorted(r)


def test_module_new_id_uses_process_source() -> None:
    a = new_id("x")
    b = new_id("x")
    assert a < b


# --- clocks ------------------------------------------------------------------------------------


def test_real_clock_is_utc_aware() -> None:
    value = Clock().now()
    assert value.tzinfo is not None
    assert value.utcoffset() == timedelta(0)


def test_real_clock_monotonic_does_not_go_back() -> None:
    c = Clock()
    readings = [c.monotonic() for _ in range(100)]
    assert readings == sorted(readings)


def test_frozen_clock_stands_still_until_advanced() -> None:
    at = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    frozen = FrozenClock(at)
    assert frozen.now() == at
    assert frozen.now() == at
    assert frozen.monotonic() == 0.0
    frozen.advance(1.5)
    assert frozen.now() == at + timedelta(seconds=1.5)
    assert frozen.monotonic() == 1.5
    frozen.advance(60)
    assert frozen.now() == at + timedelta(seconds=61.5)
    assert frozen.monotonic() == 61.5


@pytest.mark.usefixtures("restore_clock")
def test_set_clock_swaps_and_restores() -> None:
    at = datetime(2030, 6, 1, tzinfo=UTC)
    frozen = FrozenClock(at)
    original = clock_mod.clock
    previous = set_clock(frozen)
    assert previous is original
    assert clock_mod.clock is frozen
    assert now() == at
    frozen.advance(10)
    assert now() == at + timedelta(seconds=10)
    back = set_clock(previous)
    assert back is frozen
    assert clock_mod.clock is original
    assert now() != at + timedelta(seconds=10)
    assert isinstance(now(), datetime)


@pytest.mark.usefixtures("restore_clock")
def test_set_clock_chain() -> None:
    first = FrozenClock(datetime(2001, 1, 1, tzinfo=UTC))
    second = FrozenClock(datetime(2002, 1, 1, tzinfo=UTC))
    original = set_clock(first)
    assert set_clock(second) is first
    assert now().year == 2002
    assert set_clock(first) is second
    assert now().year == 2001
    assert set_clock(original) is first


@pytest.mark.usefixtures("restore_clock")
def test_frozen_clock_does_not_affect_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock_mod, "time", FakeTime(5_000_000_000_000))
    set_clock(FrozenClock(datetime(1999, 1, 1, tzinfo=UTC)))
    assert ms_of(IdSource().new("x")) == 5_000_000
