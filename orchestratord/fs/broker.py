"""File operations beneath a root that no path can leave.

Every path is walked component by component from an open descriptor of its root with
``O_NOFOLLOW`` (``openat``-style, through ``dir_fd``): a symlink anywhere on the way is
refused, and a link swapped in after a check is never followed, because nothing is opened
by name from the top again. Only regular files are read, written or deleted (devices and
FIFOs are opened with ``O_NONBLOCK`` and refused after ``fstat``). A write goes to a new
temporary file in the same directory (``O_EXCL``), is fsynced, renamed over the target
(``rename`` replaces a name, it never follows it) and the directory is fsynced: a crash
leaves the old file or the new one, never half of one. Temporary files start with
``.~fs-`` and are never listed. Quotas count the regular files beneath the root.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from orchestrator_core.fs import RESERVED_PREFIX, FsPolicyViolation, FsRules, FsTarget

TMP_PREFIX = RESERVED_PREFIX
MAX_READ_BYTES = 16 * 1024 * 1024
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# Fault injection: called between the checks of a write and its rename (tests swap links in
# here, or kill the process).
before_rename: Callable[[int, str], None] | None = None


class FsFailure(Exception):
    """The operation was allowed but could not be done (``FS_ERROR``): not found, not text."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _violation(reason: str, message: str, target: FsTarget) -> FsPolicyViolation:
    return FsPolicyViolation(reason, message, path=target.relative)


@contextlib.contextmanager
def _walk(target: FsTarget, parts: tuple[str, ...], *, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``parts`` below the root; symlinks are refused."""
    try:
        fd = os.open(target.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FsFailure("root_unavailable", f"the root cannot be opened: {exc.strerror}") from exc
    try:
        for name in parts:
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
        yield fd
    finally:
        os.close(fd)


def _kind_at(dir_fd: int, name: str) -> str | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "special"


def _refuse_non_regular(kind: str | None, target: FsTarget) -> None:
    if kind == "symlink":
        raise _violation("symlink", "the path is a symbolic link", target)
    if kind == "special":
        raise _violation("not_regular", "the path is a device, FIFO or socket", target)


def _open_file(dir_fd: int, name: str, target: FsTarget) -> int:
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
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise FsFailure("is_a_directory", "the path is a directory")
        raise _violation("not_regular", "the path is a device, FIFO or socket", target)
    return fd


def _usage(target: FsTarget) -> tuple[int, int]:
    """(bytes, files) of the regular files beneath the root, links not followed."""
    total = files = 0
    stack = [target.root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) and not entry.name.startswith(TMP_PREFIX):
                    total += entry.stat(follow_symlinks=False).st_size
                    files += 1
    return total, files


def read(rules: FsRules, target: FsTarget, content: str | None = None) -> dict[str, Any]:
    rules.check_name(target.relative)
    if not target.parts:
        raise FsFailure("is_a_directory", "the root is a directory")
    with _walk(target, target.parts[:-1]) as dir_fd:
        fd = _open_file(dir_fd, target.parts[-1], target)
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


def write(rules: FsRules, target: FsTarget, content: str | None = None) -> dict[str, Any]:
    rules.check_name(target.relative)
    if not target.parts:
        raise FsFailure("is_a_directory", "the root is a directory")
    data = (content or "").encode("utf-8")
    name = target.parts[-1]
    with _walk(target, target.parts[:-1], create=True) as dir_fd:
        kind = _kind_at(dir_fd, name)
        _refuse_non_regular(kind, target)
        if kind == "dir":
            raise FsFailure("is_a_directory", "the path is a directory")
        if rules.quota_bytes is not None or rules.quota_files is not None:
            used, files = _usage(target)
            old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size if kind else 0
            if rules.quota_bytes is not None and used - old + len(data) > rules.quota_bytes:
                raise _violation(
                    "quota", f"the write passes quota_bytes ({rules.quota_bytes})", target
                )
            if rules.quota_files is not None and kind is None and files + 1 > rules.quota_files:
                raise _violation(
                    "quota", f"the write passes quota_files ({rules.quota_files})", target
                )
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
    return {"size": len(data), "sha256": "sha256:" + hashlib.sha256(data).hexdigest()}


def listing(rules: FsRules, target: FsTarget, content: str | None = None) -> dict[str, Any]:
    if target.parts:
        rules.check_name(target.relative, is_dir=True)
    with _walk(target, target.parts) as dir_fd:
        entries = []
        with os.scandir(dir_fd) as it:
            for entry in it:
                if entry.name.startswith(TMP_PREFIX):
                    continue
                rel = f"{target.relative}/{entry.name}" if target.parts else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if rules.visible(rel, is_dir=True):
                        entries.append({"name": entry.name, "type": "dir", "size": 0})
                elif entry.is_file(follow_symlinks=False) and rules.visible(rel, is_dir=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    entries.append({"name": entry.name, "type": "file", "size": size})
    return {"entries": sorted(entries, key=lambda e: e["name"])}


def stat_path(rules: FsRules, target: FsTarget, content: str | None = None) -> dict[str, Any]:
    if not target.parts:
        st = os.stat(target.root)
        return {"type": "dir", "size": 0, "mtime": _rfc3339(st.st_mtime)}
    with _walk(target, target.parts[:-1]) as dir_fd:
        kind = _kind_at(dir_fd, target.parts[-1])
        _refuse_non_regular(kind, target)
        if kind is None:
            raise FsFailure("not_found", "no such file or directory")
        rules.check_name(target.relative, is_dir=kind == "dir")
        st = os.stat(target.parts[-1], dir_fd=dir_fd, follow_symlinks=False)
    return {
        "type": kind,
        "size": st.st_size if kind == "file" else 0,
        "mtime": _rfc3339(st.st_mtime),
    }


def delete(rules: FsRules, target: FsTarget, content: str | None = None) -> dict[str, Any]:
    rules.check_name(target.relative)
    if not target.parts:
        raise FsFailure("is_a_directory", "the root cannot be deleted")
    with _walk(target, target.parts[:-1]) as dir_fd:
        kind = _kind_at(dir_fd, target.parts[-1])
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


def run_op(rules: FsRules, op: str, path: str, content: str | None) -> dict[str, Any]:
    """One operation, by name; every refusal is ``FsPolicyViolation``."""
    return OPS[op](rules, rules.resolve(path), content)


OPS: dict[str, Callable[[FsRules, FsTarget, str | None], dict[str, Any]]] = {
    "read": read,
    "write": write,
    "list": listing,
    "stat": stat_path,
    "delete": delete,
}
