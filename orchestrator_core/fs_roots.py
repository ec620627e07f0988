"""Which directories a run may name as its ``fs_policy`` roots: the operator's choice, not the
client's.

A root must be an absolute path that lies, once resolved (symlinks and ``..`` followed), beneath
a root the operator allows (``fs.allowed_roots``), and never in a protected place: the
kernel's file systems (``/proc``, ``/sys``, ``/dev``), which hold the server's environment and
memory, nor the server's own files (its database, its logs). Each refusal names
``fs_policy.roots[i]``. This is the rule on names alone: the caller resolves each root (I/O),
and the file broker checks what it opens by device and inode, so a place reached through a
bind mount or any other spelling is refused there too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator_core.errors import InvalidParams

# Never reachable, whatever the operator allows.
KERNEL_DIRS = ("/proc", "/sys", "/dev")
FIELD = "fs_policy.roots"


def beneath(path: str, base: str) -> bool:
    """``path`` is ``base`` or lies below it (both absolute and normalized)."""
    return base == "/" or path == base or path.startswith(base + "/")


def root_refusal(
    resolved: str, *, allowed: Sequence[str], protected: Sequence[str]
) -> tuple[str, str] | None:
    """Why a resolved root may not be used, as ``(reason, message)``; None if it may."""
    for place in protected:
        if beneath(resolved, place):
            return "protected", f"{resolved} is in {place}, which is never reachable"
    if not any(beneath(resolved, base) for base in allowed):
        bases = ", ".join(allowed) or "none"
        return "root_not_allowed", f"{resolved} is not beneath fs.allowed_roots ({bases})"
    return None


@dataclass(frozen=True)
class RootBounds:
    """The operator's allowed roots and the protected places, each resolved already."""

    allowed: tuple[str, ...]
    protected: tuple[str, ...] = KERNEL_DIRS

    def refusal(self, resolved: str) -> tuple[str, str] | None:
        return root_refusal(resolved, allowed=self.allowed, protected=self.protected)

    def check(self, roots: Sequence[str], resolve: Callable[[str], str]) -> None:
        """Every root in bounds, or ``InvalidParams`` naming ``fs_policy.roots[i]``."""
        for i, root in enumerate(roots):
            field = f"{FIELD}[{i}]"
            if not root.startswith("/"):
                raise InvalidParams("a root is an absolute path", field=field)
            why = self.refusal(resolve(root))
            if why is not None:
                raise InvalidParams(why[1], field=field, details={"reason": why[0]})
