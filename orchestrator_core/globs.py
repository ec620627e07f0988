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
    """The set opened at ``glob[i - 1]`` and where the glob goes on: ``fnmatch.translate``'s
    steps, quirks and all (a range reversed is dropped, and a ``!`` it leaves first
    negates), then its Python set written for RE2 (every ``[`` escaped: ``[:`` opens a
    class name in RE2)."""
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
    stuff = glob[i:j]
    if "-" not in stuff:
        stuff = stuff.replace("\\", r"\\")
    else:
        chunks = _chunks(glob, i, j)
        stuff = "-".join(s.replace("\\", r"\\").replace("-", r"\-") for s in chunks)
    if not stuff:
        return _NOTHING, j + 1
    if stuff == "!":
        return ".", j + 1
    if stuff[0] == "!":
        stuff = "^" + stuff[1:]
    elif stuff[0] in ("^", "["):
        stuff = "\\" + stuff
    return f"[{_for_re2(stuff)}]", j + 1


def _chunks(glob: str, i: int, j: int) -> list[str]:
    """``glob[i:j]`` cut at its range hyphens, reversed ranges dropped (fnmatch's loop)."""
    chunks: list[str] = []
    k = i + 2 if glob[i] == "!" else i + 1
    while True:
        k = glob.find("-", k, j)
        if k < 0:
            break
        chunks.append(glob[i:k])
        i = k + 1
        k = k + 3
    chunk = glob[i:j]
    if chunk:
        chunks.append(chunk)
    else:
        chunks[-1] += "-"
    for k in range(len(chunks) - 1, 0, -1):
        if chunks[k - 1][-1] > chunks[k][0]:
            chunks[k - 1] = chunks[k - 1][:-1] + chunks[k][1:]
            del chunks[k]
    return chunks


def _for_re2(stuff: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(stuff):
        if stuff[i] == "\\":
            out.append(stuff[i : i + 2])
            i += 2
            continue
        out.append("\\[" if stuff[i] == "[" else stuff[i])
        i += 1
    return "".join(out)


def _compiled(pattern: str, glob: str, field: str) -> Regex:
    try:
        return re2_regex(pattern)
    except RegexError as exc:
        raise InvalidParams(f"a glob RE2 cannot run ({exc})", field=field) from None
