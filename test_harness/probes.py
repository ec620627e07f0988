"""A ``/healthz`` poller in a process of its own: whether a server stayed responsive while a
hostile request was served (tests/hostile.py, bench/hostile.py).

It asks ``/healthz`` every 50 ms on a fresh connection and reports every wait it measured. A
server whose event loop one request holds answers the poller late; that is the measure. Being
a process of its own, the caller's work cannot delay its probes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# The figures the attacks are held to (issue: p99 below 300 ms, no wait above 1 s), asserted
# generously for two shared cores.
P99_LIMIT_S = 0.3
MAX_LIMIT_S = 1.0

_POLLER = textwrap.dedent(
    """
    import json, sys, threading, time, http.client
    host, port, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    waits = []
    stop = threading.Event()
    def watch_stdin():
        sys.stdin.read()
        stop.set()
    threading.Thread(target=watch_stdin, daemon=True).start()
    print("ready", flush=True)
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            c = http.client.HTTPConnection(host, port, timeout=30)
            c.request("GET", "/healthz")
            c.getresponse().read()
            c.close()
        except OSError:
            pass
        waits.append(time.perf_counter() - t0)
        stop.wait(max(0.0, every - (time.perf_counter() - t0)))
    sys.stdout.write(json.dumps(waits) + "\\n")
    sys.stdout.flush()
    """
)


@dataclass
class PollReport:
    waits: list[float]

    @property
    def count(self) -> int:
        return len(self.waits)

    @property
    def p99_s(self) -> float:
        if not self.waits:
            return 0.0
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    @property
    def max_s(self) -> float:
        return max(self.waits, default=0.0)

    def line(self, what: str = "") -> str:
        return (
            f"/healthz poller{' during ' + what if what else ''}: {self.count} probes, "
            f"p99 {self.p99_s * 1000:.0f} ms, max {self.max_s * 1000:.0f} ms"
        )

    def check(
        self, what: str = "", *, p99_s: float = P99_LIMIT_S, max_s: float = MAX_LIMIT_S
    ) -> None:
        """Print the figures, then assert them (at least a few probes were made)."""
        print(self.line(what))
        assert self.count >= 3, self.line(what)
        assert self.p99_s < p99_s, self.line(what)
        assert self.max_s < max_s, self.line(what)


@dataclass
class Probes:
    report: PollReport = field(default_factory=lambda: PollReport([]))


@contextlib.contextmanager
def poller(url: str, *, every_s: float = 0.05) -> Iterator[Probes]:
    """Probe ``url``'s ``/healthz`` every ``every_s`` from another process until the block ends."""
    host, port = url.removeprefix("http://").split(":")
    proc = subprocess.Popen(
        [sys.executable, "-c", _POLLER, host, port, str(every_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    probes = Probes()
    try:
        yield probes
    finally:
        out, _ = proc.communicate(input="", timeout=60)
        probes.report = PollReport(json.loads(out.strip().splitlines()[-1]))


def _status_mb(pid: int, name: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {name} for pid {pid}")


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB."""
    return _status_mb(pid, "VmRSS")


def peak_rss_mb(pid: int) -> float:
    """The most resident memory process ``pid`` has held so far, in MiB."""
    return _status_mb(pid, "VmHWM")


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
