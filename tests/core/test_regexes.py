"""Client regexes on RE2 (orchestrator_core.regexes): what compiles, what is refused and how
it is named, ECMA-262 escapes, text RE2 cannot encode."""

from __future__ import annotations

import re

import pytest

from orchestrator_core.errors import InvalidParams
from orchestrator_core.regexes import (
    MAX_PROGRAM,
    RegexError,
    check_schema_regex,
    compile_regex,
    ecma_to_re2,
    re2_regex,
    schema_regex,
)


@pytest.mark.parametrize(
    "pattern",
    [
        r"(a)\1",  # a backreference
        r"^(?=a)",  # lookahead
        r"(?<!a)b",  # lookbehind
        r"a++",  # possessive
        r"a{1001}",  # past RE2's repetition bound
        r"[\p{L}\p{N}]{1,255}",  # too large a program for RE2's memory bound
        r"\p{L}{1,30}",  # compiles, to more than MAX_PROGRAM instructions
        "(",
    ],
)
def test_patterns_re2_cannot_run_are_refused_naming_the_field(pattern: str) -> None:
    with pytest.raises(InvalidParams) as info:
        compile_regex(pattern, field="policy.rules[0].pattern")
    assert info.value.field == "policy.rules[0].pattern"
    assert "RE2 cannot run" in info.value.message
    with pytest.raises(RegexError):
        schema_regex(pattern)


def test_the_catastrophic_pattern_compiles_and_fails_to_match_at_once() -> None:
    regex = compile_regex(r"^(a+)+$", field="x")
    assert regex.search("a" * 100_000 + "b") is None
    assert regex.search("a" * 30) is not None


def test_units_are_the_program_size() -> None:
    # the binding's RE2 object is read for its program size (regexes._Re2): pinned here
    assert re2_regex("a").units >= 1
    assert re2_regex(".{0,1000}x").units > 1000
    assert re2_regex(".{0,1000}x").units <= MAX_PROGRAM


def test_a_refusal_names_the_reason_as_text() -> None:
    with pytest.raises(RegexError) as info:
        re2_regex("(?=x)")
    assert "invalid perl operator" in str(info.value)
    assert "b'" not in str(info.value)


@pytest.mark.parametrize(
    ("ecma", "re2"),
    [
        (r"^\u00e9$", r"^\x{E9}$"),
        (r"\u{1F600}", r"\x{1F600}"),
        (r"\ud83d\ude00", r"\x{1F600}"),  # a surrogate pair is one code point
        (r"\\u00e9", r"\\u00e9"),  # an escaped backslash, then a literal "u00e9"
        (r"a\.b", r"a\.b"),
        (r"\u00zz", r"\u00zz"),  # not an escape: left for RE2 to refuse
        ("plain", "plain"),
    ],
)
def test_ecma_unicode_escapes_are_rewritten_for_re2(ecma: str, re2: str) -> None:
    assert ecma_to_re2(ecma) == re2


def test_a_schema_pattern_with_a_unicode_escape_matches() -> None:
    assert schema_regex(r"^caf\u00e9$").search("café") is not None
    with pytest.raises(InvalidParams) as info:
        check_schema_regex(r"\u00zz", field="tools[0].parameters.pattern")
    assert info.value.field == "tools[0].parameters.pattern"


def test_dollar_matches_at_the_very_end_as_in_ecma() -> None:
    # Python's $ also matches before a final newline; ECMA-262's and RE2's do not
    assert re.search("^a$", "a\n") is not None
    assert schema_regex("^a$").search("a\n") is None


def test_text_with_lone_surrogates_is_matched_with_offsets_kept() -> None:
    regex = re2_regex("b+")
    text = "a\ud800bb"
    assert regex.search(text) is not None
    assert [m.span() for m in regex.finditer(text)] == [(2, 4)]
    assert re2_regex("a.bb").fullmatch(text) is not None


def test_finditer_resumes_at_pos() -> None:
    assert [m.span() for m in re2_regex("a+").finditer("xaaxa", 2)] == [(2, 3), (4, 5)]
