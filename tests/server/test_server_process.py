"""The real ``orchestratord serve`` process, read over a plain socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.helpers import parse_sse

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = {
        **os.environ,
        "ORCHESTRATORD_SIM__TOKENS_PER_S": "500",
        "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestratord",
            "serve",
            "--engine",
            "sim",
            "--port",
            str(port),
            "--database-url",
            db_url,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise AssertionError(f"server exited: {out}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError("server did not become ready")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def _raw_sse(port: int, path: str, headers: str = "") -> tuple[str, str]:
    """GET over a bare socket: (head, body) with chunked encoding undone."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
            f"{headers}Connection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, raw = data.partition(b"\r\n\r\n")
    body = b""
    while raw:
        size_line, _, rest = raw.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body += rest[:size]
        raw = rest[size + 2 :]
    return head.decode(), body.decode()


def test_serve_streams_over_a_socket(server: str) -> None:
    with httpx.Client(base_url=server, timeout=30) as c:
        flow = c.post("/v1/flows", json={"ast": {"p": 1}}).json()
        run = c.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 3}).json()
        step = c.post(
            f"/v1/runs/{run['run_id']}/steps",
            json={
                "type": "llm_call",
                "client_token": "a",
                "input": {"prompt": "hi", "params": {"max_tokens": 40}},
            },
        ).json()
    port = int(server.rsplit(":", 1)[1])
    head, body = _raw_sse(port, f"/v1/steps/{step['step_id']}/stream")
    assert head.startswith("HTTP/1.1 200")
    assert "cache-control: no-cache" in head.lower()
    assert "x-correlation-id:" in head.lower()
    events, _ = parse_sse(body)
    assert [e.event for e in events] == ["started"] + ["token"] * 40 + ["end"]
    end = events[-1].data
    assert end is not None and end["provenance"]["tokens_out"] == 40
    # resume over the socket
    _, tail = _raw_sse(port, f"/v1/steps/{step['step_id']}/stream", "Last-Event-ID: 39\r\n")
    resumed, _ = parse_sse(tail)
    assert [e.id for e in resumed] == ["40", "41"]
    assert orjson.loads(orjson.dumps(resumed[-1].data)) == end
