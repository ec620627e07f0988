"""SQLite serves one process: a second ``orchestratord`` on the same file is refused.

The process that opens a SQLite database file holds an exclusive ``flock`` on
``<file>.lock`` (its pid written inside) for as long as it runs; the operating system drops
the lock when the process dies, kill -9 included, so no stale lock survives a crash. Another
process (or another orchestrator in the same process) that tries to open the same file is
refused with :class:`DatabaseInUse`, naming the file and the pid that holds it, instead of
two writers corrupting each other's view or waiting on each other's locks. In-memory
databases and PostgreSQL (several processes by design) take no lock.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sqlalchemy.engine import make_url

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# Locks that ``serve`` took and keeps for the orchestrator it starts (see hand_over).
_handed_over: dict[Path, int] = {}


class DatabaseInUse(RuntimeError):
    pass


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    return Path(database).resolve()


class SingleProcessLock:
    def __init__(self, database: Path) -> None:
        self.database = database
        self.path = database.with_name(database.name + ".lock")
        self._fd: int | None = None

    @classmethod
    def for_url(cls, url: str) -> SingleProcessLock | None:
        database = sqlite_file(url)
        return None if database is None else cls(database)

    def acquire(self) -> None:
        if fcntl is None:  # pragma: no cover
            log.warning("no file locks here: a second process on %s is not refused", self.database)
            return
        handed = _handed_over.pop(self.database, None)
        if handed is not None:  # taken at the command line, kept for us: no gap to race into
            self._fd = handed
            return
        self.database.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DatabaseInUse(
                f"the SQLite database {self.database} is in use by another orchestratord "
                f"process (pid {holder}); SQLite serves one process: stop that one, or use "
                "PostgreSQL for several processes"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def hand_over(self) -> None:
        """Keep the lock held for the next :meth:`acquire` of the same file in this process:
        ``serve`` checks before the server starts and the orchestrator it starts takes the lock
        over, so another process starting at the same moment cannot slip in between."""
        if self._fd is not None:
            _handed_over[self.database] = self._fd
            self._fd = None

    def release(self) -> None:
        """Let go (also what the process's death does)."""
        if self._fd is not None and fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
