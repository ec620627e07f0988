"""Globs a client writes (a run's policy ``match`` fields, its ``fs_policy`` allow and deny
lists), matched on RE2 (``orchestrator_core.regexes``).

A glob translated for Python's ``re`` backtracks: ``**a**a**a**a**a**a**b`` against a
70-character path took 6.4 s. The same translation compiled by RE2 matches in time linear in
the path. Two dialects:

- :func:`path_glob`: ``**`` crosses directories, ``*`` and ``?`` stay within one, ``**/``
  also matches no directory; every other character is literal; the whole path must match.
- :func:`name_glob`: the shell's, as :func:`fnmatch.fnmatchcase` reads it (``*``, ``?``,
  ``[seq]``, ``[!seq]``), case-sensitive, the whole name. ``tests/core/test_globs.py`` checks
  it against ``fnmatch`` on random globs.

A glob too large for RE2's bounds (``regexes.MAX_PROGRAM``) is :class:`InvalidParams` naming
the field.
"""

from __future__ import annotations

import re2

from orchestrator_core.errors import InvalidParams
from orchestrator_core.regexes import Regex, RegexError, re2_regex

__all__ = ["name_glob", "path_glob"]

_NOTHING = r"[^\x{0}-\x{10FFFF}]"  # an empty set: RE2 has no ``(?!)``


def path_glob(glob: str, *, field: str = "glob") -> Regex:
    """The path glob as an RE2 pattern, for ``fullmatch``."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        if glob.startswith("**", i):
            i += 2
            if glob.startswith("/", i):
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re2.escape(glob[i]))
            i += 1
    return _compiled("(?s)" + "".join(out), glob, field)


def name_glob(glob: str, *, field: str = "glob") -> Regex:
    """The shell glob as an RE2 pattern, for ``fullmatch`` (``fnmatch.translate``'s reading,
    its consecutive ``*`` merged, without the lookaheads it adds for Python's engine)."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            if not out or out[-1] != ".*":
                out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            part, i = _bracket(glob, i)
            out.append(part)
        else:
            out.append(re2.escape(c))
    return _compiled("(?s)" + "".join(out), glob, field)


def _bracket(glob: str, i: int) -> tuple[str, int]:
    """The set opened at ``glob[i - 1]`` and where the glob goes on (fnmatch's rules: ``!``
    negates, a ``]`` first is literal, an unclosed ``[`` is a literal, empty ranges drop)."""
    n = len(glob)
    j = i
    if j < n and glob[j] == "!":
        j += 1
    if j < n and glob[j] == "]":
        j += 1
    while j < n and glob[j] != "]":
        j += 1
    if j >= n:
        return re2.escape("["), i
    negated = glob[i] == "!"
    body = glob[i + 1 if negated else i : j]
    chunks = _ranges(body) if "-" in body else None
    if chunks is None:
        members = "".join(_member(c) for c in body)
    else:
        members = "-".join("".join(_member(c) for c in chunk) for chunk in chunks)
    if not members:
        return ("." if negated else _NOTHING), j + 1
    return f"[{'^' if negated else ''}{members}]", j + 1


def _ranges(body: str) -> list[str]:
    """``body`` cut at its range hyphens, as fnmatch cuts it, with reversed ranges dropped."""
    chunks: list[str] = []
    start, k = 0, 1
    while True:
        k = body.find("-", k)
        if k < 0:
            break
        chunks.append(body[start:k])
        start = k + 1
        k += 3
    rest = body[start:]
    if rest:
        chunks.append(rest)
    else:
        chunks[-1] += "-"
    for k in range(len(chunks) - 1, 0, -1):
        if chunks[k - 1][-1] > chunks[k][0]:
            chunks[k - 1] = chunks[k - 1][:-1] + chunks[k][1:]
            del chunks[k]
    return chunks


def _member(c: str) -> str:
    return "\\" + c if c in "\\]-[^" else c


def _compiled(pattern: str, glob: str, field: str) -> Regex:
    try:
        return re2_regex(pattern)
    except RegexError as exc:
        raise InvalidParams(f"a glob RE2 cannot run ({exc})", field=field) from None
