"""SQLite serves one process: a second orchestratord on the same file is refused, naming the
file and the pid holding it; a killed holder leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestratord.db.single_process import DatabaseInUse
from orchestratord.runtime import Orchestrator
from tests.conftest import make_settings
from tests.procs import orchestratord


async def test_a_second_orchestrator_on_the_file_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "one.db"
    settings = make_settings(f"sqlite:///{db}")
    first = Orchestrator(settings)
    await first.start()
    try:
        second = Orchestrator(settings)
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
    assert Orchestrator(make_settings("sqlite:///:memory:")).lock is None


def serve_args(db: Path, port: str = "0") -> list[str]:
    return [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim", "--port", port]


@pytest.mark.slow
def test_a_second_process_is_refused_and_a_killed_one_leaves_no_lock(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    with orchestratord(tmp_path, "--engine", "sim", "--database-url", url):
        second = subprocess.run(
            [*serve_args(db, "1"), "--database-url", url],
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
        )
        assert second.returncode == 2
        err = second.stderr.decode()
        assert f"the SQLite database {db} is in use by another orchestratord process" in err
        assert "Traceback" not in err
    # kill -9 of the holder: the operating system drops its lock
    from tests.procs import free_port, process

    port = free_port()
    args = [*serve_args(db, str(port)), "--database-url", url]
    with process(args, ready_url=f"http://127.0.0.1:{port}/healthz", cwd=tmp_path) as proc:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        with orchestratord(tmp_path, "--engine", "sim", "--database-url", url):
            pass  # started: nothing stale held it
