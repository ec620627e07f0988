"""A throwaway PostgreSQL cluster for one test: ``initdb`` on a free port, started, restarted
and stopped with ``pg_ctl``, removed after. The shared server at 127.0.0.1:5432 is never
touched.

``initdb`` refuses to run as root: as root, the cluster belongs to the ``postgres`` user (or
``nobody``), and its binaries run as that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import free_port

PG_BIN_ENV = "ORCHESTRATORD_TEST_PG_BIN"  # a folder holding initdb and pg_ctl
TOOLS = ("initdb", "pg_ctl")


def pg_bin() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: the setting, else PATH, else the newest
    Debian-style install (/usr/lib/postgresql/<version>/bin)."""
    named = os.environ.get(PG_BIN_ENV)
    candidates = [Path(named)] if named else []
    found = shutil.which("initdb")
    if found is not None:
        candidates.append(Path(found).parent)
    installed = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += [Path(p) for p in sorted(installed, key=_version, reverse=True)]
    for folder in candidates:
        if all(os.access(folder / tool, os.X_OK) for tool in TOOLS):
            return folder
    return None


def _version(path: str) -> float:
    try:
        return float(Path(path).parent.name)
    except ValueError:
        return 0.0


def _owner() -> pwd.struct_passwd | None:
    """The user the cluster runs as: this one, or, as root, ``postgres`` (else ``nobody``)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    return None


def require_cluster_tools() -> Path:
    """The binaries' folder; skipped (failed under CI=true) with the reason when missing."""
    folder = pg_bin()
    problem = None
    if folder is None:
        problem = (
            f"{' and '.join(TOOLS)} not found (PATH, /usr/lib/postgresql/*/bin, ${PG_BIN_ENV})"
        )
    elif os.geteuid() == 0 and _owner() is None:
        problem = "initdb refuses root and neither a postgres nor a nobody user exists"
    if problem is None:
        assert folder is not None
        return folder
    if os.environ.get("CI") == "true":
        pytest.fail(f"{problem}; CI=true requires them", pytrace=False)
    pytest.skip(problem)


class Cluster:
    """One PostgreSQL server in a temporary folder, on a free loopback port."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.port = free_port()
        self.owner = _owner()
        self.root = Path(tempfile.mkdtemp(prefix="orch-chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if self.owner is not None:
            os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout_s: float = 60) -> None:
        kwargs: dict[str, object] = {}
        if self.owner is not None:
            kwargs = {"user": self.owner.pw_uid, "group": self.owner.pw_gid, "extra_groups": []}
        done = subprocess.run(
            [str(self.bin / tool), *args],
            capture_output=True,
            timeout=timeout_s,
            cwd=self.root,
            check=False,
            **kwargs,  # type: ignore[call-overload]
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{tool} {' '.join(args)} exited {done.returncode}: "
                f"{done.stdout.decode()[-2000:]}{done.stderr.decode()[-2000:]}{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        try:
            return "\nserver log:\n" + self.log.read_text()[-3000:]
        except OSError:
            return ""

    def init(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def _options(self) -> str:
        # its socket in its own folder; durability off: a throwaway cluster
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200 -c shared_buffers=32MB"
        )

    def _ctl(self, action: str, *extra: str) -> None:
        self._run(
            "pg_ctl",
            action,
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "30",
            "-o",
            self._options(),
            *extra,
        )

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """``pg_ctl restart`` (fast mode: every session is terminated)."""
        self._ctl("restart", "-m", "fast")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-m", mode)

    def destroy(self) -> None:
        """Stopped (however it stands) and removed."""
        with contextlib.suppress(Exception):
            self.stop("immediate")
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGKILL)  # pg_ctl failed: the postmaster itself
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    cluster = Cluster(require_cluster_tools())
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
