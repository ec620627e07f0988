"""An engine server started as a child process of this one.

It listens on a port chosen free on the loopback interface, writes its output to a log file
(whose last lines a failed start reports), and dies with this process (Linux: the parent
death signal; elsewhere at this process's shutdown). It is healthy once its health URL
answers 200."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from orchestrator_core.errors import PoolUnavailable

log = logging.getLogger(__name__)

HEALTH_POLL_S = 0.25
STOP_GRACE_S = 5.0
LOG_TAIL_BYTES = 2000


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    """In the child, before exec: ask Linux to SIGTERM it when this process dies."""
    if not sys.platform.startswith("linux"):
        return None

    def set_pdeathsig() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return set_pdeathsig


@dataclass
class EngineProcess:
    replica_id: str
    argv: list[str]
    port: int
    url: str  # what the replica dials
    health_url: str
    log_path: Path
    process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def as_dict(self) -> dict[str, object]:
        return {
            "replica_id": self.replica_id,
            "pid": self.pid,
            "port": self.port,
            "url": self.url,
            "log": str(self.log_path),
        }

    async def start(self, timeout_s: float) -> None:
        """Start it and wait for its health to answer 200; on failure it is stopped and
        ``PoolUnavailable`` says why, with its log's last lines."""
        with self.log_path.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
            )
        try:
            await self._wait_healthy(timeout_s)
        except BaseException:
            await self.stop()
            raise

    async def _wait_healthy(self, timeout_s: float) -> None:
        assert self.process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                if self.process.returncode is not None:
                    raise self._failed(f"exited with status {self.process.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.health_url)).status_code == 200:
                        return
                if loop.time() >= deadline:
                    raise self._failed(f"not healthy after {timeout_s:g} s")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HEALTH_POLL_S):
                        await self.process.wait()

    def _failed(self, why: str) -> PoolUnavailable:
        return PoolUnavailable(
            f"engine {self.replica_id} ({self.argv[0]}) {why}",
            details={"replica_id": self.replica_id, "log": str(self.log_path), "tail": self.tail()},
            retriable=False,
        )

    def tail(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, self.log_path.stat().st_size - LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; waits for it to exit."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        log.info("engine %s (pid %s) stopped", self.replica_id, process.pid)


def log_dir() -> Path:
    """Where engines' output goes: one file per engine."""
    path = Path(tempfile.gettempdir()) / f"orchestratord-engines-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path
