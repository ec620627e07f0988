"""Start real server processes for tests: orchestratord and llama.cpp's OpenAI server."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(
    args: list[str],
    *,
    ready_url: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 60,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` until the block ends, once ``ready_url`` answers 200."""
    log = (cwd / f"proc-{time.monotonic_ns()}.log").open("wb")
    proc = subprocess.Popen(
        args, cwd=cwd, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{args[:4]} exited: {Path(log.name).read_text()[-3000:]}")
            try:
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{args[:4]} not ready: {Path(log.name).read_text()[-3000:]}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def orchestratord(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "orchestratord", "serve", "--port", str(port), *args]
    with process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", cwd=cwd, env=env):
        yield f"http://127.0.0.1:{port}"


def ended_step(c: httpx.Client, step_id: str) -> dict[str, Any]:
    """The step once it has ended, on a server in another process: its event stream, which
    the server closes after the step's end (or error), read to its close; then the step."""
    from tests.helpers import parse_sse

    r = c.get(f"/v1/steps/{step_id}/stream")
    assert r.status_code == 200, r.text
    events, _ = parse_sse(r.text)
    assert events and events[-1].event in ("end", "error"), events[-1:]
    body: dict[str, Any] = c.get(f"/v1/steps/{step_id}").json()
    return body
