"""Hostile requests against a real ``serve`` process, with a ``/healthz`` poller that says
whether the server stayed responsive while each one was served.

    with serve(tmp_path, "--engine", "sim") as server, poller(server.url) as probes:
        ...  # the hostile request
    probes.report.check("what")   # p99 and the longest wait, printed, then asserted

``Server.rss_mb()`` reads the server's resident memory from ``/proc``, ``cpu_s()`` its CPU time.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from test_harness import probes
from test_harness.probes import MAX_LIMIT_S, P99_LIMIT_S, PollReport, Probes, poller
from tests.procs import free_port, process

__all__ = ["MAX_LIMIT_S", "P99_LIMIT_S", "PollReport", "Probes", "Server", "poller", "serve"]


@dataclass
class Server:
    url: str
    pid: int
    data_dir: Path

    def rss_mb(self) -> float:
        return probes.rss_mb(self.pid)

    def peak_rss_mb(self) -> float:
        """The most resident memory the server has held so far."""
        return probes.peak_rss_mb(self.pid)

    def cpu_s(self) -> float:
        """User plus system CPU seconds the server process has used so far."""
        return probes.cpu_s(self.pid)


@contextlib.contextmanager
def serve(
    cwd: Path, *args: str, env: dict[str, str] | None = None, ready_path: str = "/healthz"
) -> Iterator[Server]:
    """A real ``orchestratord serve`` in ``cwd`` (its SQLite file and data there)."""
    port = free_port()
    cmd = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port), *args]
    url = f"http://127.0.0.1:{port}"
    with process(cmd, ready_url=url + ready_path, cwd=cwd, env=env) as proc:
        yield Server(url=url, pid=proc.pid, data_dir=cwd)
