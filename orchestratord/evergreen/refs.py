"""Chunks given by reference (``Chunk.ref``): read only from ``file://`` URIs inside the
run's ``fs_policy`` roots, through the file broker (the same rules as an ``fs_op`` read:
roots, allow/deny globs, no links out, UTF-8 text, a size cap, the operator's allowed roots
and the protected places). A path outside them is
``PERMISSION_DENIED``; a file that cannot be read ``NOT_FOUND`` or ``INVALID_ARGUMENT``;
any other scheme ``UNIMPLEMENTED`` naming it. A leaf's references are read in order and
concatenated, as the protocol says."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import unquote, urlsplit

from orchestrator_core.fs import FsPolicyViolation, FsRules
from orchestratord.evergreen.nodes import Leaf, SessionAbort
from orchestratord.fs.broker import FsFailure, off_loop, run_op
from orchestratord.fs.guard import FsGuard


def _path(ref: str, node_id: str) -> str:
    parts = urlsplit(ref)
    if parts.scheme != "file":
        raise SessionAbort(
            "UNIMPLEMENTED",
            f"node {node_id!r}: references of scheme {parts.scheme or '(none)'!r} are not "
            "read (file:// inside the run's fs roots is; else send the data inline)",
        )
    if parts.netloc not in ("", "localhost"):
        raise SessionAbort(
            "UNIMPLEMENTED", f"node {node_id!r}: file:// references name this host only"
        )
    return unquote(parts.path)


def _read(guard: FsGuard, rules: FsRules, ref: str, node_id: str) -> bytes:
    path = _path(ref, node_id)
    try:
        found: dict[str, Any] = run_op(guard, rules, "read", path, None)
    except FsPolicyViolation as exc:
        raise SessionAbort("PERMISSION_DENIED", f"node {node_id!r}: {ref}: {exc.message}") from None
    except FsFailure as exc:
        code = "NOT_FOUND" if exc.reason == "not_found" else "INVALID_ARGUMENT"
        raise SessionAbort(code, f"node {node_id!r}: {ref}: {exc.message}") from None
    return str(found["content"]).encode()


async def resolved(
    leaves: list[Leaf], fs_policy: dict[str, Any] | None, guard: FsGuard
) -> list[Leaf]:
    """``leaves`` with every reference read into its data (``guard``: the server's bounds)."""
    if not any(leaf.refs for leaf in leaves):
        return leaves
    rules = FsRules.from_policy(fs_policy)
    out = []
    for leaf in leaves:
        if not leaf.refs:
            out.append(leaf)
            continue
        parts = [await off_loop(_read, guard, rules, ref, leaf.node_id) for ref in leaf.refs]
        out.append(replace(leaf, data=b"".join(parts), ref=None, refs=()))
    return out
