"""Globs on RE2 (orchestrator_core.globs): the shell dialect agrees with fnmatch, the path
dialect with the policy's rules (tests/core/test_policy.py holds its cases)."""

from __future__ import annotations

import fnmatch
import random

import pytest

from orchestrator_core.errors import InvalidParams
from orchestrator_core.globs import name_glob, path_glob

_ALPHABET = "ab-!]^[*?\\/.é"


def _random_glob(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 8)))


@pytest.mark.parametrize("seed", range(20))
def test_name_globs_match_as_fnmatch_does(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        glob = _random_glob(rng)
        regex = name_glob(glob)
        for _ in range(10):
            name = "".join(rng.choice("ab-!]^[\\/.é\n") for _ in range(rng.randint(0, 6)))
            expected = fnmatch.fnmatchcase(name, glob)
            assert (regex.fullmatch(name) is not None) is expected, (glob, name)


@pytest.mark.parametrize(
    ("glob", "name", "expected"),
    [
        ("gpt-*", "gpt-4o", True),
        ("gpt-*", "claude", False),
        ("[!a]x", "bx", True),
        ("[!a]x", "ax", False),
        ("[z-a]", "m", False),  # an empty range matches nothing
        ("[!z-a]", "m", True),
        ("[a-]", "-", True),
        ("[", "[", True),
        ("*a*a*a*a*a*a*b", "a" * 70, False),
        ("a*", "a\nb", True),
    ],
)
def test_name_glob_cases(glob: str, name: str, expected: bool) -> None:
    assert (name_glob(glob).fullmatch(name) is not None) is expected
    assert fnmatch.fnmatchcase(name, glob) is expected


def test_the_catastrophic_path_glob_is_refused_by_nothing_and_matches() -> None:
    glob = "**a**a**a**a**a**a**b"
    regex = path_glob(glob)
    assert regex.fullmatch("a/" * 35) is None
    assert regex.fullmatch("a/" * 35 + "b") is not None


def test_a_glob_re2_cannot_hold_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidParams) as info:
        path_glob("?" * 20_000, field="fs_policy.deny[0]")
    assert info.value.field == "fs_policy.deny[0]"
