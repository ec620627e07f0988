"""Regular expressions a client writes, run on RE2.

A client's regex (a JSON Schema ``pattern`` or ``patternProperties`` key, a redact rule's
``pattern``, a glob translated to a regex) is matched here, never on Python's ``re``: ``re``
backtracks, so ``^(a+)+$`` against 30 ``a`` and a ``b`` runs for minutes on the thread that
asked, while RE2 matches in time linear in the text whatever the pattern. The binding is
``google-re2`` (the ``re2`` module): published by RE2's authors at Google from the RE2
repository itself, kept in step with it, with wheels for CPython 3.11 on Linux, macOS and
Windows, and an ``re``-like API (``search``, ``fullmatch``, ``finditer`` with ``pos``).

What RE2 gives up for that bound is backreferences and lookaround (``\\1``, ``(?=``,
``(?<!``); a pattern that uses them, or that is too large for RE2's memory bound, cannot
be compiled and is refused where it is declared (:class:`~orchestrator_core.errors.
InvalidParams` naming the field). JSON Schema patterns are ECMA-262; RE2 reads them as they
are, after ``\\uXXXX`` (and ``\\u{X...}``) escapes are written as RE2's ``\\x{...}``
(:func:`ecma_to_re2`). ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII in RE2, as in ECMA-262
(``\\s`` leaves out the Unicode spaces ECMA adds), and ``$`` matches at the end of the text
only, as in ECMA-262.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any, Protocol

import re2

from orchestrator_core.errors import InvalidParams

__all__ = [
    "Pattern",
    "Regex",
    "RegexError",
    "check_schema_regex",
    "compile_regex",
    "ecma_to_re2",
    "re2_regex",
    "schema_regex",
]

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the client's error, not a line on stderr
# RE2's memory for one pattern, its program and its DFA's states: 1 MiB (the default is 8)
# refuses a pattern too large for it within ~10 ms instead of compiling it for up to 0.5 s
# (``[\p{L}\p{N}]{1,255}``: 342,468 instructions), and bounds what 1,024 kept patterns hold.
_OPTIONS.max_mem = 1 << 20
# The most instructions a client's pattern may compile to: compiling costs about a
# microsecond per instruction, and a character can cost a match one step per instruction
# (``\p{L}+`` is about 600; ``.{0,1000}`` 9,005; ``\p{L}{1,30}`` 35,913 is refused).
MAX_PROGRAM = 10_000
_HEX = frozenset("0123456789abcdefABCDEF")
# our own pattern, a character class: Python's engine cannot backtrack on it
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class Pattern(Protocol):
    """What matching code uses of a compiled pattern; ``re.Pattern`` has the same members."""

    @property
    def pattern(self) -> str: ...
    def search(self, text: str, pos: int = 0, /) -> Any: ...
    def fullmatch(self, text: str, /) -> Any: ...
    def finditer(self, text: str, pos: int = 0, /) -> Iterator[Any]: ...


class Regex(Pattern, Protocol):
    """A client's pattern on RE2."""

    @property
    def units(self) -> int:
        """RE2 instructions one character may cost at worst (its program size)."""
        ...


class RegexError(ValueError):
    """RE2 cannot run the pattern; the message says why."""


class _Re2:
    """An RE2 pattern matched against text that may hold lone surrogates (a JSON ``\\ud800``
    escape reads as one): RE2 takes UTF-8, which has no form for them, so such a text is
    matched with each one read as U+FFFD, one character for one, offsets unchanged."""

    __slots__ = ("_regex", "pattern", "units")

    def __init__(self, pattern: str, regex: Any) -> None:
        self.pattern = pattern
        self._regex = regex
        # RE2's program size: what one character can cost at worst, in instructions
        # (the binding keeps the RE2 object as ``_regexp``; tests/core/test_regexes.py pins it)
        program = regex._regexp
        self.units: int = max(1, program.ProgramSize(), program.ReverseProgramSize())

    def search(self, text: str, pos: int = 0) -> Any:
        try:
            return self._regex.search(text, pos)
        except UnicodeEncodeError:
            return self._regex.search(_encodable(text), pos)

    def fullmatch(self, text: str) -> Any:
        try:
            return self._regex.fullmatch(text)
        except UnicodeEncodeError:
            return self._regex.fullmatch(_encodable(text))

    def finditer(self, text: str, pos: int = 0) -> Iterator[Any]:
        if not text.isascii():  # finditer encodes as it goes: ask first
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                text = _encodable(text)
        return self._regex.finditer(text, pos)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r})"


def _encodable(text: str) -> str:
    return _LONE_SURROGATE.sub("\ufffd", text)


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Regex | RegexError:
    # a refusal is kept too: a schema stored before RE2 judged it asks again at each check
    try:
        regex = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        return RegexError(str(reason))
    except UnicodeEncodeError:
        return RegexError("a lone surrogate, which has no UTF-8 form")
    compiled = _Re2(pattern, regex)
    if compiled.units > MAX_PROGRAM:
        return RegexError(
            f"it compiles to {compiled.units} RE2 instructions, more than {MAX_PROGRAM}"
        )
    return compiled


def _regex(pattern: str) -> Regex:
    found = _compiled(pattern)
    if isinstance(found, RegexError):
        raise RegexError(*found.args)
    return found


def re2_regex(pattern: str) -> Regex:
    """``pattern`` (RE2 syntax) compiled, or :class:`RegexError`; compiled once per pattern."""
    return _regex(pattern)


def compile_regex(pattern: str, *, field: str) -> Regex:
    """A client's ``pattern`` compiled by RE2, or :class:`InvalidParams` naming ``field``."""
    try:
        return _regex(pattern)
    except RegexError as exc:
        raise InvalidParams(_refusal(exc), field=field) from None


def schema_regex(pattern: str) -> Regex:
    """A JSON Schema (ECMA-262) pattern compiled by RE2, or :class:`RegexError`."""
    return _regex(ecma_to_re2(pattern))


def check_schema_regex(pattern: str, *, field: str) -> None:
    """:class:`InvalidParams` naming ``field`` when RE2 cannot run the JSON Schema pattern."""
    try:
        schema_regex(pattern)
    except RegexError as exc:
        raise InvalidParams(_refusal(exc), field=field) from None


def _refusal(exc: RegexError) -> str:
    return (
        f"a regular expression RE2 cannot run ({exc}): patterns run in linear time, without "
        "backreferences or lookaround"
    )


def ecma_to_re2(pattern: str) -> str:
    """ECMA-262's ``\\uXXXX`` and ``\\u{X...}`` escapes as RE2's ``\\x{...}`` (a surrogate pair
    as the one code point it stands for); everything else as written."""
    if "\\u" not in pattern:
        return pattern
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch != "\\" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        if pattern[i + 1] != "u":
            out.append(pattern[i : i + 2])  # an escape pair, kept whole: ``\\\\u`` stays
            i += 2
            continue
        code, end = _unicode_escape(pattern, i)
        if code is None:
            out.append(pattern[i : i + 2])  # left for RE2 to refuse
            i += 2
            continue
        low, after = _unicode_escape(pattern, end) if 0xD800 <= code < 0xDC00 else (None, end)
        if low is not None and 0xDC00 <= low < 0xE000:
            code, end = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00), after
        out.append(f"\\x{{{code:X}}}")
        i = end
    return "".join(out)


def _unicode_escape(pattern: str, at: int) -> tuple[int | None, int]:
    """The code point of a ``\\u`` escape at ``at`` and where it ends, or ``(None, at)``."""
    if not pattern.startswith("\\u", at):
        return None, at
    digits = pattern[at + 2 : at + 6]
    if len(digits) == 4 and set(digits) <= _HEX:
        return int(digits, 16), at + 6
    if pattern.startswith("{", at + 2):
        close = pattern.find("}", at + 3)
        inner = pattern[at + 3 : close] if close > 0 else ""
        if 0 < len(inner) <= 6 and set(inner) <= _HEX and int(inner, 16) <= 0x10FFFF:
            return int(inner, 16), close + 1
    return None, at
