"""SQLite serves one process: a second orchestratord on the same file is refused, naming the
file and the pid holding it; a killed holder leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestratord.db.single_process import DatabaseInUse, SingleProcessLock
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.procs import free_port, process

# Takes the lock of the file at argv[1] in a process of its own, then lets go.
TRY_LOCK = (
    "import sys; from orchestratord.db.single_process import SingleProcessLock as L; "
    "lock = L.for_url(sys.argv[1]); lock.acquire(); lock.release(); print('acquired')"
)


def try_lock_elsewhere(url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TRY_LOCK, url], cwd=cwd, capture_output=True, text=True, timeout=30
    )


async def test_a_second_orchestrator_on_the_file_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "one.db"
    settings = make_settings(f"sqlite:///{db}")
    first = Orchestrator(settings)
    await first.start()
    try:
        second = Orchestrator(settings)  # same process, its own open of the lock file
        with pytest.raises(DatabaseInUse) as info:
            await second.start()
        message = str(info.value)
        assert str(db) in message and f"pid {os.getpid()}" in message
        assert "PostgreSQL" in message
    finally:
        await first.stop()
    third = Orchestrator(settings)  # the first let go
    await third.start()
    await third.stop()


async def test_in_memory_and_other_files_are_independent(tmp_path: Path) -> None:
    a = Orchestrator(make_settings(f"sqlite:///{tmp_path / 'a.db'}"))
    b = Orchestrator(make_settings(f"sqlite:///{tmp_path / 'b.db'}"))
    await a.start()
    await b.start()
    await b.stop()
    await a.stop()
    m1 = Orchestrator(make_settings("sqlite:///:memory:"))
    m2 = Orchestrator(make_settings("sqlite:///:memory:"))
    assert m1.lock is None and m2.lock is None
    await m1.start()
    await m2.start()  # each its own database: nothing to refuse
    await m2.stop()
    await m1.stop()
    assert not list(tmp_path.glob("*memory*"))


async def test_the_lock_serve_checks_is_held_on_for_its_orchestrator(tmp_path: Path) -> None:
    """``serve`` checks the lock before the server starts and keeps it for the orchestrator
    the server starts, so a process starting at the same moment finds it held throughout."""
    db = tmp_path / "handed.db"
    url = f"sqlite:///{db}"
    checked = SingleProcessLock.for_url(url)
    assert checked is not None
    checked.acquire()
    checked.hand_over()
    orch = Orchestrator(make_settings(url))
    try:
        meanwhile = try_lock_elsewhere(url, tmp_path)
        assert meanwhile.returncode != 0
        assert f"the SQLite database {db} is in use" in meanwhile.stderr
        assert f"(pid {os.getpid()})" in meanwhile.stderr
        await orch.start()  # takes the handed-over lock, not refused by it
        assert try_lock_elsewhere(url, tmp_path).returncode != 0
    finally:
        await orch.stop()
    after = try_lock_elsewhere(url, tmp_path)
    assert after.returncode == 0 and "acquired" in after.stdout


def serve_args(url: str, port: int) -> list[str]:
    serve = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim"]
    return [*serve, "--port", str(port), "--database-url", url]


@pytest.mark.slow
def test_a_second_process_is_refused_and_a_killed_one_leaves_no_lock(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    port = free_port()
    with process(
        serve_args(url, port), ready_url=f"http://127.0.0.1:{port}/healthz", cwd=tmp_path
    ) as first:
        second = subprocess.run(
            serve_args(url, free_port()), cwd=tmp_path, capture_output=True, timeout=60
        )
        assert second.returncode == 2
        err = second.stderr.decode()
        assert (
            f"the SQLite database {db} is in use by another orchestratord process "
            f"(pid {first.pid})" in err
        )
        assert "use PostgreSQL for several processes" in err
        assert "Traceback" not in err
        # kill -9 of the holder: the operating system drops its lock
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        port = free_port()
        with process(
            serve_args(url, port), ready_url=f"http://127.0.0.1:{port}/healthz", cwd=tmp_path
        ):
            pass  # healthy: nothing stale held the file
