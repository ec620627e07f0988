"""What the file broker may reach: the operator's allowed roots, and the places it never does.

A run's roots are checked when the run is made (:meth:`FsGuard.check_roots`, by resolved name,
``orchestrator_core.fs_roots``, and by device for roots that exist) and again by the broker
at every operation (a run stored earlier or imported may carry any root): it opens the
allowed root, walks down to the run's root with ``O_NOFOLLOW`` (:meth:`FsGuard.open_root`),
and checks every directory and file it opens by device and inode (:class:`Protected`), so a
protected place reached through a bind mount, a link or any spelling is refused as well.

Protected, whatever the operator allows: every file system the kernel shows at or below
``/proc``, ``/sys`` and ``/dev`` (proc, sysfs, devtmpfs, devpts, cgroup, ... and the tmpfs of
``/dev/shm``), those three directories themselves, and the server's own files: its SQLite
database with whatever SQLite and the server put beside it (every name starting with the
database file's name, existing or not: ``-wal``, ``-shm``, ``-journal``, ``.lock``), and the
regular files its standard output and error are written to (its log), and its pools file
(which may hold upstream API keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator_core.errors import InvalidParams
from orchestrator_core.fs import FsPolicyViolation
from orchestrator_core.fs_roots import FIELD, KERNEL_DIRS, RootBounds, beneath
from orchestratord.db.single_process import sqlite_file
from orchestratord.settings import Settings

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MOUNTINFO = "/proc/self/mountinfo"
# The kernel's own file systems: whatever they show belongs to the kernel and its processes.
KERNEL_FS = frozenset(
    {
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "mqueue",
        "cgroup",
        "cgroup2",
        "securityfs",
        "debugfs",
        "tracefs",
        "bpf",
        "configfs",
        "pstore",
        "efivarfs",
        "fusectl",
        "binfmt_misc",
        "hugetlbfs",
        "nsfs",
        "rpc_pipefs",
    }
)

Ident = tuple[int, int]  # (st_dev, st_ino)


def _ident(st: os.stat_result) -> Ident:
    return st.st_dev, st.st_ino


@dataclass(frozen=True)
class Protected:
    """Places compared by identity, not by name."""

    devices: frozenset[int] = frozenset()  # every file on them
    inodes: frozenset[Ident] = frozenset()  # these directories and files
    names: dict[Ident, tuple[str, ...]] = field(default_factory=dict)  # dir -> name prefixes

    def place(self, st: os.stat_result) -> bool:
        """An opened (or stat'ed) directory or file that is protected."""
        return st.st_dev in self.devices or _ident(st) in self.inodes

    def entry(self, dir_st: os.stat_result, name: str) -> bool:
        """A name in a directory that is protected, whether or not the file exists yet."""
        return any(name.startswith(p) for p in self.names.get(_ident(dir_st), ()))

    @classmethod
    def of(cls, files: Iterable[str]) -> Protected:
        inodes: set[Ident] = set()
        names: dict[Ident, tuple[str, ...]] = {}
        for place in KERNEL_DIRS:
            with contextlib.suppress(OSError):
                inodes.add(_ident(os.stat(place)))
        for path in files:
            with contextlib.suppress(OSError):
                inodes.add(_ident(os.stat(path)))
            with contextlib.suppress(OSError):
                parent = _ident(os.stat(os.path.dirname(path)))
                names[parent] = (*names.get(parent, ()), os.path.basename(path))
        return cls(devices=frozenset(kernel_devices()), inodes=frozenset(inodes), names=names)


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _unescape(field_: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are written as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def kernel_devices(mountinfo: str = MOUNTINFO) -> set[int]:
    """Devices of the kernel's file systems mounted anywhere, and of the tmpfs mounted at or
    below ``/dev`` (``/dev`` in a container, ``/dev/shm``). Without a mountinfo: the devices
    of ``/proc``, ``/sys`` and ``/dev`` where they are mounts of their own."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        root = os.stat("/").st_dev
        found = set()
        for place in KERNEL_DIRS:
            with contextlib.suppress(OSError):
                found.add(os.stat(place).st_dev)
        return found - {root}
    devices = set()
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, fstype = left.split(), right.split()[:1]
        if len(fields) < 5 or not fstype:
            continue
        point = _unescape(fields[4])
        under_kernel_dir = any(beneath(point, d) for d in KERNEL_DIRS)
        if fstype[0] in KERNEL_FS or (fstype[0] == "tmpfs" and under_kernel_dir):
            major, _, minor = fields[2].partition(":")
            devices.add(os.makedev(int(major), int(minor)))
    return devices


def log_files() -> list[str]:
    """The regular files the server's standard output and error go to."""
    found = []
    for fd in (1, 2):
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                found.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return [f for f in found if f.startswith("/")]


class FsGuard:
    """The operator's bounds on every run's roots, and what the broker never opens."""

    def __init__(self, allowed: Sequence[str], server_files: Sequence[str] = ()) -> None:
        self.files = [os.path.realpath(f) for f in server_files]
        self.bounds = RootBounds(
            allowed=tuple(os.path.realpath(a) for a in allowed),
            protected=(*KERNEL_DIRS, *self.files),
        )
        self.protected = Protected.of(self.files)

    def refresh(self) -> None:
        """Take in the inodes of server files made since (the database, once migrated)."""
        self.protected = Protected.of(self.files)

    async def admit(self, fs_policy: dict[str, Any] | None) -> None:
        """:meth:`check_roots` off the event loop, for a run that names roots."""
        if (fs_policy or {}).get("roots"):
            await asyncio.to_thread(self.check_roots, fs_policy)

    def check_roots(self, fs_policy: dict[str, Any] | None) -> None:
        """A new run's roots, or ``InvalidParams`` naming ``fs_policy.roots[i]`` (resolves
        each root: blocking I/O)."""
        roots = list((fs_policy or {}).get("roots") or [])
        self.bounds.check(roots, os.path.realpath)
        for i, root in enumerate(roots):
            try:
                st = os.stat(root)
            except (OSError, ValueError):
                continue  # not there yet: the broker checks it when it is opened
            if self.protected.place(st):
                raise InvalidParams(
                    f"{root} is on a file system that is never reachable (/proc, /sys, /dev)",
                    field=f"{FIELD}[{i}]",
                    details={"reason": "protected"},
                )

    def open_root(self, root: str) -> int:
        """A descriptor of ``root``, reached from the allowed root that holds it one
        component at a time without following links: ``FsPolicyViolation`` if it is out of
        bounds, ``OSError`` if it cannot be opened."""
        real = os.path.realpath(root)
        why = self.bounds.refusal(real)
        if why is not None:
            raise FsPolicyViolation(why[0], why[1], path=root)
        base = max((a for a in self.bounds.allowed if beneath(real, a)), key=len)
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.check_dir(fd, root)
            for name in filter(None, real[len(base) :].split("/")):
                try:
                    nxt = os.open(name, _DIR, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, name):
                        raise FsPolicyViolation(
                            "symlink", f"a link was put on the way to the root {root}", path=root
                        ) from None
                    raise
                os.close(fd)
                fd = nxt
                self.check_dir(fd, root)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check_dir(self, fd: int, path: str) -> None:
        if self.protected.place(os.fstat(fd)):
            raise FsPolicyViolation("protected", "the path reaches a protected place", path=path)

    def check_entry(self, dir_fd: int, name: str, st: os.stat_result | None, path: str) -> None:
        """A file or directory ``name`` in ``dir_fd`` (``st``: its stat, None if absent)."""
        if self.protected.entry(os.fstat(dir_fd), name) or (
            st is not None and self.protected.place(st)
        ):
            raise FsPolicyViolation("protected", "the path is a protected file", path=path)
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise FsPolicyViolation(
                "hardlink", "the file has other hard links (it may lie outside the root)", path=path
            )


def guard_for(settings: Settings) -> FsGuard:
    """The guard of a server with ``settings``: its allowed roots; its database, its pools
    file (upstream keys) and its logs protected."""
    database = sqlite_file(settings.database_url)
    files = [str(f) for f in (database, settings.pools_file) if f is not None]
    return FsGuard(settings.fs.allowed_roots, [*files, *log_files()])


def make_data_roots(settings: Settings) -> None:
    """Make the allowed roots that lie in the server's data directory (the default one)."""
    data_dir = str(settings.data_dir)
    for root in settings.fs.allowed_roots:
        if beneath(root, data_dir):
            os.makedirs(root, mode=0o750, exist_ok=True)
