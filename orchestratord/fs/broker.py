"""File operations beneath a root that no path can leave.

Every path is walked component by component from an open descriptor of its root with
``O_NOFOLLOW`` (``openat``-style, through ``dir_fd``): a symlink anywhere on the way is
refused, and a link swapped in after a check is never followed, because nothing is opened
by name from the top again. Only regular files are read, written or deleted (devices and
FIFOs are opened with ``O_NONBLOCK`` and refused after ``fstat``). A write goes to a new
temporary file in the same directory (``O_EXCL``), is fsynced, renamed over the target
(``rename`` replaces a name, it never follows it) and the directory is fsynced: a crash
leaves the old file or the new one, never half of one. Temporary files start with
``.~fs-`` and are never listed.

The root itself is opened through the guard (``orchestratord.fs.guard``): from the operator's
allowed root down, without following links; every directory and file opened on the way is
checked by device and inode against the protected places (the kernel's file systems, the
server's database and logs). A regular file with other hard links is refused (``hardlink``):
its other names may lie outside the root.

Quotas count the regular files beneath the root. A write under a quota holds an exclusive
``flock`` on the root directory from its count to its rename, so concurrent writes to one
root, from threads or from processes sharing it, are counted one after another and never
pass the quota together. Operations run in a thread pool of their own (:func:`off_loop`): one
waiting for a root's lock never holds a thread that other work of the server waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from orchestrator_core.fs import RESERVED_PREFIX, FsPolicyViolation, FsRules, FsTarget
from orchestratord.fs.guard import FsGuard

TMP_PREFIX = RESERVED_PREFIX
MAX_READ_BYTES = 16 * 1024 * 1024
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# Fault injection: called between the checks of a write and its rename (tests swap links in
# here, or kill the process).
before_rename: Callable[[int, str], None] | None = None

T = TypeVar("T")
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fs-broker")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the broker's threads."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)


class FsFailure(Exception):
    """The operation was allowed but could not be done (``FS_ERROR``): not found, not text."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _violation(reason: str, message: str, target: FsTarget) -> FsPolicyViolation:
    return FsPolicyViolation(reason, message, path=target.relative)


def _open_root(guard: FsGuard, target: FsTarget) -> int:
    try:
        return guard.open_root(target.root)
    except OSError as exc:
        raise FsFailure("root_unavailable", f"the root cannot be opened: {exc.strerror}") from exc


@contextlib.contextmanager
def _root(guard: FsGuard, target: FsTarget) -> Iterator[int]:
    fd = _open_root(guard, target)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _walk(
    guard: FsGuard, target: FsTarget, parts: tuple[str, ...], *, create: bool = False
) -> Iterator[int]:
    """A descriptor of the directory ``parts`` below the root; symlinks are refused."""
    fd = _open_root(guard, target)
    try:
        for name in parts:
            guard.check_entry(fd, name, None, target.relative)  # no directory of its names
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise FsFailure("not_found", f"no directory {name!r} on the way") from None
                os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    kind = _kind_at(fd, name)
                    if kind == "symlink":
                        raise _violation(
                            "symlink", f"{name!r} is a symbolic link", target
                        ) from None
                    raise FsFailure("not_a_directory", f"{name!r} is not a directory") from None
                raise
            os.close(fd)
            fd = nxt
            guard.check_dir(fd, target.relative)
        yield fd
    finally:
        os.close(fd)


def _kind(st: os.stat_result | None) -> str | None:
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "special"


def _kind_at(dir_fd: int, name: str) -> str | None:
    try:
        return _kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except FileNotFoundError:
        return None


def _refuse_non_regular(kind: str | None, target: FsTarget) -> None:
    if kind == "symlink":
        raise _violation("symlink", "the path is a symbolic link", target)
    if kind == "special":
        raise _violation("not_regular", "the path is a device, FIFO or socket", target)


def _entry(guard: FsGuard, dir_fd: int, name: str, target: FsTarget) -> os.stat_result | None:
    """The stat of ``name`` (None if absent), refused if protected or a hard link."""
    try:
        st: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    guard.check_entry(dir_fd, name, st, target.relative)
    return st


def _open_file(guard: FsGuard, dir_fd: int, name: str, target: FsTarget) -> int:
    guard.check_entry(dir_fd, name, None, target.relative)  # a protected name, there or not
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except FileNotFoundError:
        raise FsFailure("not_found", "no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _violation("symlink", "the path is a symbolic link", target) from None
        raise
    try:
        st = os.fstat(fd)
        guard.check_entry(dir_fd, name, st, target.relative)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FsFailure("is_a_directory", "the path is a directory")
        raise _violation("not_regular", "the path is a device, FIFO or socket", target)
    return fd


def _usage(guard: FsGuard, root_fd: int) -> tuple[int, int]:
    """(bytes, files) of the regular files beneath the root, links not followed, protected
    places left out. Each directory is opened from its parent's descriptor; as many are open
    at once as the tree is deep."""
    total = files = 0
    stack: list[tuple[int, list[str]]] = [(root_fd, [])]
    try:
        fd = root_fd
        while fd >= 0:
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.name.startswith(TMP_PREFIX):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack[-1][1].append(entry.name)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                        files += 1
            fd = _next_dir(guard, stack, root_fd)
    finally:
        for fd, _ in stack:
            if fd != root_fd:
                os.close(fd)
    return total, files


def _next_dir(guard: FsGuard, stack: list[tuple[int, list[str]]], root_fd: int) -> int:
    """The next directory to count, opened below the deepest one with names left and pushed
    on ``stack``; -1 when none is left."""
    while stack:
        parent, names = stack[-1]
        if not names:
            stack.pop()
            if parent != root_fd:
                os.close(parent)
            continue
        try:
            sub = os.open(names.pop(), _DIR, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                continue  # gone, or swapped for a link, since it was listed
            raise
        if guard.protected.place(os.fstat(sub)):
            os.close(sub)
            continue
        stack.append((sub, []))
        return sub
    return -1


@contextlib.contextmanager
def _quota_lock(guard: FsGuard, rules: FsRules, target: FsTarget) -> Iterator[int | None]:
    """The root's descriptor, locked for this write's count and rename, when a quota holds."""
    if rules.quota_bytes is None and rules.quota_files is None:
        yield None
        return
    with _root(guard, target) as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)  # dropped when the descriptor closes
        yield fd


def _check_quota(
    guard: FsGuard,
    rules: FsRules,
    root_fd: int,
    old: os.stat_result | None,
    size: int,
    target: FsTarget,
) -> None:
    used, files = _usage(guard, root_fd)
    before = old.st_size if old is not None else 0
    if rules.quota_bytes is not None and used - before + size > rules.quota_bytes:
        raise _violation("quota", f"the write passes quota_bytes ({rules.quota_bytes})", target)
    if rules.quota_files is not None and old is None and files + 1 > rules.quota_files:
        raise _violation("quota", f"the write passes quota_files ({rules.quota_files})", target)


def read(
    guard: FsGuard, rules: FsRules, target: FsTarget, content: str | None = None
) -> dict[str, Any]:
    rules.check_name(target.relative)
    if not target.parts:
        raise FsFailure("is_a_directory", "the root is a directory")
    with _walk(guard, target, target.parts[:-1]) as dir_fd:
        fd = _open_file(guard, dir_fd, target.parts[-1], target)
        try:
            size = os.fstat(fd).st_size
            if size > MAX_READ_BYTES:
                raise FsFailure("too_large", f"the file is over {MAX_READ_BYTES} bytes")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FsFailure("not_text", "the file is not UTF-8 text") from None
    return {
        "content": text,
        "size": len(data),
        "sha256": "sha256:" + hashlib.sha256(data).hexdigest(),
    }


def write(
    guard: FsGuard, rules: FsRules, target: FsTarget, content: str | None = None
) -> dict[str, Any]:
    rules.check_name(target.relative)
    if not target.parts:
        raise FsFailure("is_a_directory", "the root is a directory")
    data = (content or "").encode("utf-8")
    name = target.parts[-1]
    with (
        _quota_lock(guard, rules, target) as root_fd,
        _walk(guard, target, target.parts[:-1], create=True) as dir_fd,
    ):
        old = _entry(guard, dir_fd, name, target)
        _refuse_non_regular(_kind(old), target)
        if _kind(old) == "dir":
            raise FsFailure("is_a_directory", "the path is a directory")
        if root_fd is not None:
            _check_quota(guard, rules, root_fd, old, len(data), target)
        _replace(dir_fd, name, data)
    return {"size": len(data), "sha256": "sha256:" + hashlib.sha256(data).hexdigest()}


def _replace(dir_fd: int, name: str, data: bytes) -> None:
    """``data`` under ``name``, whole or not at all: a new file renamed over the name."""
    tmp = f"{TMP_PREFIX}{secrets.token_hex(8)}"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o644,
        dir_fd=dir_fd,
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename(dir_fd, name)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def listing(
    guard: FsGuard, rules: FsRules, target: FsTarget, content: str | None = None
) -> dict[str, Any]:
    if target.parts:
        rules.check_name(target.relative, is_dir=True)
    with _walk(guard, target, target.parts) as dir_fd:
        entries = []
        here = os.fstat(dir_fd)
        with os.scandir(dir_fd) as it:
            for entry in it:
                if entry.name.startswith(TMP_PREFIX) or guard.protected.entry(here, entry.name):
                    continue
                rel = f"{target.relative}/{entry.name}" if target.parts else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if rules.visible(rel, is_dir=True) and not guard.protected.place(
                        entry.stat(follow_symlinks=False)
                    ):
                        entries.append({"name": entry.name, "type": "dir", "size": 0})
                elif entry.is_file(follow_symlinks=False) and rules.visible(rel, is_dir=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    entries.append({"name": entry.name, "type": "file", "size": size})
    return {"entries": sorted(entries, key=lambda e: e["name"])}


def stat_path(
    guard: FsGuard, rules: FsRules, target: FsTarget, content: str | None = None
) -> dict[str, Any]:
    if not target.parts:
        with _root(guard, target) as fd:
            st = os.fstat(fd)
        return {"type": "dir", "size": 0, "mtime": _rfc3339(st.st_mtime)}
    with _walk(guard, target, target.parts[:-1]) as dir_fd:
        found = _entry(guard, dir_fd, target.parts[-1], target)
        kind = _kind(found)
        _refuse_non_regular(kind, target)
        if found is None or kind is None:
            raise FsFailure("not_found", "no such file or directory")
        rules.check_name(target.relative, is_dir=kind == "dir")
    return {
        "type": kind,
        "size": found.st_size if kind == "file" else 0,
        "mtime": _rfc3339(found.st_mtime),
    }


def delete(
    guard: FsGuard, rules: FsRules, target: FsTarget, content: str | None = None
) -> dict[str, Any]:
    rules.check_name(target.relative)
    if not target.parts:
        raise FsFailure("is_a_directory", "the root cannot be deleted")
    with _walk(guard, target, target.parts[:-1]) as dir_fd:
        found = _entry(guard, dir_fd, target.parts[-1], target)
        kind = _kind(found)
        _refuse_non_regular(kind, target)
        if kind is None:
            raise FsFailure("not_found", "no such file")
        if kind == "dir":
            raise FsFailure("is_a_directory", "only files are deleted")
        os.unlink(target.parts[-1], dir_fd=dir_fd)
        os.fsync(dir_fd)
    return {"deleted": True}


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def run_op(
    guard: FsGuard, rules: FsRules, op: str, path: str, content: str | None
) -> dict[str, Any]:
    """One operation, by name; every refusal is ``FsPolicyViolation``."""
    return OPS[op](guard, rules, rules.resolve(path), content)


Op = Callable[[FsGuard, FsRules, FsTarget, str | None], dict[str, Any]]
OPS: dict[str, Op] = {
    "read": read,
    "write": write,
    "list": listing,
    "stat": stat_path,
    "delete": delete,
}
