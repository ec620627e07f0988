"""The real ``orchestratord serve`` process, read over a plain socket."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.helpers import parse_sse
from tests.procs import orchestratord

pytestmark = pytest.mark.slow


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[str]:
    env = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "500", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}
    with orchestratord(tmp_path, "--engine", "sim", "--database-url", db_url, env=env) as url:
        yield url


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
    assert [e.event for e in events] == ["started", "narration"] + ["token"] * 40 + ["end"]
    end = events[-1].data
    assert end is not None and end["provenance"]["tokens_out"] == 40
    # resume over the socket
    _, tail = _raw_sse(port, f"/v1/steps/{step['step_id']}/stream", "Last-Event-ID: 40\r\n")
    resumed, _ = parse_sse(tail)
    assert [e.id for e in resumed] == ["41", "42"]
    assert orjson.loads(orjson.dumps(resumed[-1].data)) == end
