"""Hostile engines against a real ``serve --pools`` process: an OpenAI-compatible engine
(``test_harness.hostile_openai``) that sends a 100 MB token, a 100 MB error body, keep-alives
and no token, a token every so often forever, or 429 with ``Retry-After``. Each step ends
with a clear error or succeeds, the server stores nothing oversized, and a ``/healthz``
poller sees it answer meanwhile."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostile import Server, poller, serve
from tests.procs import ended_step, free_port, process

pytestmark = pytest.mark.slow

IDLE_S = 1.0  # engine_limits.idle_timeout_s of the server
DEADLINE_S = 3.0  # engine_limits.step_deadline_s
MAX_OUTPUT = 256 << 10  # engine_limits.max_output_bytes
ATTEMPTS = 3  # of each attack that ends at once, for the poller to see a few probes


@dataclass
class Hostile:
    server: Server
    engine_url: str
    client: httpx.Client

    def step(self, prompt: str, **budgets: int) -> dict[str, Any]:
        """A new run's llm_call step of ``prompt``, once it has ended."""
        flow = self.client.post("/v1/flows", json={"ast": {"hostile": "engine"}}).json()
        run = self.client.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 1}).json()
        body: dict[str, Any] = {
            "type": "llm_call",
            "client_token": "s",
            "input": {"prompt": prompt, "params": {"max_tokens": 16}},
        }
        if budgets:
            body["budgets"] = budgets
        r = self.client.post(f"/v1/runs/{run['run_id']}/steps", json=body)
        assert r.status_code in (200, 201, 202), r.text
        return ended_step(self.client, r.json()["step_id"])

    def stats(self) -> dict[str, Any]:
        found: dict[str, Any] = httpx.get(f"{self.engine_url}/stats").json()
        return found


@contextlib.contextmanager
def _engine(directory: Path) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "test_harness.hostile_openai", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with process(cmd, ready_url=f"{url}/health", cwd=directory):
        yield url


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    directory = tmp_path_factory.mktemp("hostile-engines")
    with _engine(directory) as engine_url:
        pools = directory / "pools.yaml"
        pools.write_text(
            "pools:\n  - pool_id: p\n    engine: openai\n    replicas:\n"
            f"      - {{replica_id: r0, slots: 1, url: '{engine_url}/v1', model: hostile}}\n"
        )
        env = {
            "ORCHESTRATORD_ENGINE_LIMITS__IDLE_TIMEOUT_S": str(IDLE_S),
            "ORCHESTRATORD_ENGINE_LIMITS__STEP_DEADLINE_S": str(DEADLINE_S),
            "ORCHESTRATORD_ENGINE_LIMITS__MAX_OUTPUT_BYTES": str(MAX_OUTPUT),
        }
        with (
            serve(directory, "--pools", str(pools), env=env) as server,
            httpx.Client(base_url=server.url, timeout=60) as client,
        ):
            yield Hostile(server, engine_url, client)


def _until(condition: Callable[[], bool], bound_s: float = 10) -> bool:
    """Whether ``condition`` holds within ``bound_s`` (a bound on waiting, not a timing)."""
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _engine_error(step: dict[str, Any], reason: str) -> dict[str, Any]:
    assert step["status"] == "failed", step
    error: dict[str, Any] = step["error"]
    assert error["code"] == "ENGINE_ERROR", error
    assert error["details"].get("reason") == reason, error
    return error


def test_a_100_mb_token_fails_the_step_and_is_never_stored(hostile: Hostile) -> None:
    cpu0 = hostile.server.cpu_s()
    with poller(hostile.server.url) as probes:
        steps = [hostile.step(f"huge-token 100 #{n}") for n in range(ATTEMPTS)]
    cpu = (hostile.server.cpu_s() - cpu0) / ATTEMPTS
    print(f"100 MB token: server CPU {cpu:.2f} s per step")
    for step in steps:
        error = _engine_error(step, "token_too_large")
        assert error["details"]["limit"] == "engine_limits.max_token_bytes"
        assert not error["retriable"]
        row = httpx.get(f"{hostile.server.url}/v1/steps/{step['step_id']}")
        assert len(row.content) < 64 << 10
    assert cpu < 2, cpu  # the quadratic splitter took 38 s; reading 0.5 MB takes little
    probes.report.check("a 100 MB token")


def test_a_100_mb_error_body_is_read_up_to_its_cap(hostile: Hostile) -> None:
    cpu0 = hostile.server.cpu_s()
    with poller(hostile.server.url) as probes:
        steps = [hostile.step(f"huge-error 100 #{n}") for n in range(ATTEMPTS)]
    cpu = (hostile.server.cpu_s() - cpu0) / ATTEMPTS
    print(f"100 MB error body: server CPU {cpu:.2f} s per step")
    for step in steps:
        assert step["status"] == "failed" and step["error"]["code"] == "ENGINE_ERROR", step
        assert "HTTP 500" in step["error"]["message"]
        assert len(step["error"]["message"]) < 2000
    assert cpu < 2, cpu
    probes.report.check("a 100 MB error body")


def test_an_engine_that_sends_only_keep_alives_is_let_go_at_the_idle_timeout(
    hostile: Hostile,
) -> None:
    left = hostile.stats()["left"]
    with poller(hostile.server.url) as probes:
        step = hostile.step("trickle 0.2")
    error = _engine_error(step, "engine_idle")
    assert error["retriable"] and error["details"]["limit"] == "engine_limits.idle_timeout_s"
    # the engine sees the client leave, and the pool's one slot is free for the next step
    assert _until(lambda: hostile.stats()["left"] > left)
    assert hostile.step("plain after trickle")["status"] == "succeeded"
    probes.report.check("keep-alives and no token")


def test_a_step_without_max_wall_ms_ends_at_the_default_deadline(hostile: Hostile) -> None:
    step = hostile.step("drip 0.2")
    error = _engine_error(step, "step_deadline")
    assert not error["retriable"] and "max_wall_ms" in error["message"]
    assert step["output"]["text"].startswith("drop drop ")
    # a budget's max_wall_ms is the step's deadline instead: it stops there, as a budget does
    budgeted = hostile.step("drip 0.2 budgeted", max_wall_ms=1500)
    assert budgeted["status"] == "succeeded", budgeted
    assert budgeted["output"]["stop_reason"] == "budget"


def test_an_output_past_its_cap_fails_the_step_with_what_came_before(hostile: Hostile) -> None:
    step = hostile.step("big-tokens 60")
    error = _engine_error(step, "output_too_large")
    assert error["details"]["limit"] == "engine_limits.max_output_bytes"
    assert 0 < len(step["output"]["text"]) <= MAX_OUTPUT


def test_a_busy_engine_is_asked_again_after_its_retry_after(hostile: Hostile) -> None:
    step = hostile.step("busy 429 1 1")
    assert step["status"] == "succeeded", step
    assert step["output"]["text"] == "one two three four"
    assert hostile.stats()["requests"]["busy 429 1 1"] == 2
    unavailable = hostile.step("busy 503 1 1")
    assert unavailable["status"] == "succeeded", unavailable


def test_a_retry_after_past_the_deadline_is_the_errors_retry_after_ms(hostile: Hostile) -> None:
    step = hostile.step("busy 429 5 30", max_wall_ms=2000)
    assert step["status"] == "failed", step
    error = step["error"]
    assert error["code"] == "ENGINE_ERROR" and error["retriable"]
    assert error["retry_after_ms"] == 30_000
    assert hostile.stats()["requests"]["busy 429 5 30"] == 1
