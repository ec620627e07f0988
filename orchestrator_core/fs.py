"""The file-system policy as rules: where a path may point, by name alone (no I/O).

A path is relative to the first root unless it is absolute and names a root. It is split
into components and refused, with a ``reason``, when it could leave its root or fool a glob:
``..`` (``outside_root``), an absolute path under no root (``outside_root``), NUL bytes,
control or format characters, names whose compatibility form differs (fullwidth dots,
one-dot leaders: ``invalid_path``), names over 255 bytes or paths over 4096
(``invalid_path``), a deny glob that matches (``denied``), allow globs of which none
matches (``not_allowed``). Globs are matched against the path relative to its root. What
the name cannot tell (symlinks, devices, FIFOs, quotas) is the broker's to refuse.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from orchestrator_core.errors import OrchestratorError
from orchestrator_core.policy import path_glob_to_regex
from orchestrator_core.regexes import Regex

MAX_PATH = 4096
MAX_NAME_BYTES = 255


class FsPolicyViolation(OrchestratorError):
    """A refused file operation (a step error); ``details.reason`` says why."""

    code = "FS_POLICY_VIOLATION"

    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(message, details={"reason": reason, **details})
        self.reason = reason


@dataclass(frozen=True)
class FsTarget:
    root: str
    parts: tuple[str, ...]  # components below the root; empty: the root itself

    @property
    def relative(self) -> str:
        return "/".join(self.parts)


def _bad_name(name: str) -> str | None:
    if name.startswith(RESERVED_PREFIX):
        return f"a name starting with {RESERVED_PREFIX} (the broker's temporary files)"
    if "\x00" in name:
        return "a NUL byte"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in name):
        return "a control, format or unassigned character"
    if unicodedata.normalize("NFKC", name) != name:
        return "characters that look like others (not in compatibility form)"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"a name over {MAX_NAME_BYTES} bytes"
    return None


# The broker writes a file under a temporary name, then renames it: such names are the
# broker's alone (never listed, not counted in quotas), so a path may not use them.
RESERVED_PREFIX = ".~fs-"


@dataclass(frozen=True)
class FsRules:
    roots: tuple[str, ...]
    allow: tuple[Regex, ...]  # globs on RE2: linear in the path, whatever the glob
    deny: tuple[Regex, ...]
    quota_bytes: int | None
    quota_files: int | None

    @classmethod
    def from_policy(cls, policy: dict[str, Any] | None) -> FsRules:
        policy = policy or {}
        roots = tuple(r.rstrip("/") or "/" for r in policy.get("roots") or [])
        return cls(
            roots=roots,
            allow=tuple(
                path_glob_to_regex(g, field=f"fs_policy.allow[{i}]")
                for i, g in enumerate(policy.get("allow") or [])
            ),
            deny=tuple(
                path_glob_to_regex(g, field=f"fs_policy.deny[{i}]")
                for i, g in enumerate(policy.get("deny") or [])
            ),
            quota_bytes=policy.get("quota_bytes"),
            quota_files=policy.get("quota_files"),
        )

    def resolve(self, path: str) -> FsTarget:
        """The root and the components of ``path``, or ``FsPolicyViolation``."""
        if not self.roots:
            raise FsPolicyViolation("no_roots", "the run's fs_policy has no roots", path=path)
        if len(path) > MAX_PATH:
            raise FsPolicyViolation("invalid_path", f"the path is over {MAX_PATH} characters")
        root = self.roots[0]
        rest = path
        if path.startswith("/"):
            for candidate in sorted(self.roots, key=len, reverse=True):
                prefix = candidate if candidate.endswith("/") else candidate + "/"
                if path == candidate or path.startswith(prefix):
                    root, rest = candidate, path[len(candidate) :]
                    break
            else:
                raise FsPolicyViolation(
                    "outside_root", "an absolute path must be under a root", path=path
                )
        parts = []
        for name in rest.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                raise FsPolicyViolation("outside_root", "'..' may not be used", path=path)
            bad = _bad_name(name)
            if bad is not None:
                raise FsPolicyViolation("invalid_path", f"the path has {bad}", path=path)
            parts.append(name)
        return FsTarget(root, tuple(parts))

    def check_name(self, relative: str, *, is_dir: bool = False) -> None:
        """Deny globs refuse; allow globs, when given, must match (files only: a directory
        is a way to files, so it is refused only by a deny glob)."""
        if any(p.fullmatch(relative) for p in self.deny):
            raise FsPolicyViolation("denied", "a deny glob of the fs_policy matches", path=relative)
        if not is_dir and self.allow and not any(p.fullmatch(relative) for p in self.allow):
            raise FsPolicyViolation(
                "not_allowed", "no allow glob of the fs_policy matches", path=relative
            )

    def visible(self, relative: str, *, is_dir: bool) -> bool:
        try:
            self.check_name(relative, is_dir=is_dir)
        except FsPolicyViolation:
            return False
        return True
