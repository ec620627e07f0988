"""Gates (CEL) against a real ``serve``: an expression that would build huge strings or
lists is refused at submission, or fails its step (over its facts, past its estimate; past
its process's memory or deadline) while the server's memory stays put; four gates waiting
over 5,000 facts leave a streaming ``llm_call`` in their run alone. A ``/healthz`` poller
runs through each."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestratord.db.models import Fact
from tests.hostile import poller, serve
from tests.procs import ended_step

pytestmark = pytest.mark.slow

RSS_GROWTH_MB = 500
# the issue's gate: 48 x 32 concatenations of twice a fact (6 GB over a 2 MB fact)
ISSUE_EXPR = (
    f"{list(range(48))}.map(x, {list(range(32))}.map(y, facts[0].data.s + facts[0].data.s))"
    ".size() > 0"
)
# 48 copies of what it reads: admitted, but over 5 MB of facts that passes 128 MiB
OVER_ITS_FACTS = f'{list(range(24))}.exists(i, facts[1].data.s + facts[1].data.s == "")'
# what no estimate sees: cel-cpp copies a map's list at each step, 50M copies for 9,999
ACCUMULATING = "facts[2].data.l.map(x, x).size() > 0"
SIM = {"ORCHESTRATORD_SIM__TOKENS_PER_S": "0", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"}


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60)


def _run(c: httpx.Client) -> str:
    r = c.post("/v1/flows", json={"ast": {"gates": 1}})
    assert r.status_code == 201, r.text
    r = c.post(f"/v1/flows/{r.json()['flow_id']}/runs", json={"seed": 1})
    assert r.status_code == 201, r.text
    run_id: str = r.json()["run_id"]
    return run_id


def _fact(c: httpx.Client, run_id: str, kind: str, data: Any) -> None:
    r = c.post(f"/v1/runs/{run_id}/facts", json={"type": kind, "data": data})
    assert r.status_code == 201, r.text


def _gate(c: httpx.Client, run_id: str, token: str, expr: str, **extra: Any) -> httpx.Response:
    body = {"type": "gate_eval", "client_token": token, "input": {"expr": expr, **extra}}
    return c.post(f"/v1/runs/{run_id}/steps", json=body)


def _failed(c: httpx.Client, r: httpx.Response) -> str:
    """The reason of a gate step that failed."""
    assert r.status_code == 202, r.text
    step = ended_step(c, r.json()["step_id"])
    assert step["status"] == "failed", step
    assert step["error"]["code"] == "GATE_EXPR_INVALID", step["error"]
    reason: str = step["error"]["details"]["reason"]
    return reason


def test_gates_that_would_build_huge_values_are_refused_or_stopped(tmp_path: Path) -> None:
    with serve(tmp_path, "--engine", "sim") as server, _client(server.url) as c:
        run_id = _run(c)
        _fact(c, run_id, "big", {"s": "x" * 2_000_000})
        _fact(c, run_id, "bigger", {"s": "y" * 3_000_000})
        _fact(c, run_id, "list", {"l": list(range(9999))})
        rss_before = _peak_reset(server.pid, server.rss_mb())  # posting a fact peaks alone
        with poller(server.url) as probes:
            r = _gate(c, run_id, "issue", ISSUE_EXPR)
            assert r.status_code == 422, r.text
            body = r.json()
            assert body["code"] == "GATE_EXPR_INVALID"
            assert body["details"]["field"] == "input.expr"
            assert body["details"]["reason"] == "cost"
            assert _failed(c, _gate(c, run_id, "over", OVER_ITS_FACTS)) == "cost"
            assert _failed(c, _gate(c, run_id, "acc", ACCUMULATING)) in ("memory", "deadline")
            after = _gate(c, run_id, "after", 'facts.exists(f, f.type == "list")')
            assert ended_step(c, after.json()["step_id"])["output"]["result"] is True
        growth = server.peak_rss_mb() - rss_before
    print(f"server peak RSS growth {growth:.0f} MB")
    probes.report.check("gates building huge values")
    assert growth < RSS_GROWTH_MB


def _peak_reset(pid: int, rss_mb: float) -> float:
    """Start the server's peak resident memory afresh (``clear_refs``: 5); ``rss_mb``."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return rss_mb


def _insert_facts(db: Path, run_id: str, count: int) -> None:
    """``count`` small facts in the run's database at once (5,000 POSTs take a minute on
    two shared cores): the gates read the facts table, whichever way rows got there."""
    engine = sa.create_engine(f"sqlite:///{db}")
    now = datetime.now(UTC)
    rows = [
        {"fact_id": f"fact_bulk{i:06d}", "run_id": run_id, "type": "n", "data": {"i": i}}
        | {"created_at": now}
        for i in range(count)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(Fact), rows)
    engine.dispose()


def _call_s(c: httpx.Client, run_id: str, token: str) -> float:
    """Seconds a 2,000-token ``llm_call`` takes, from its submission to its end."""
    params = {"max_tokens": 2000, "temperature": 0}
    body = {"type": "llm_call", "client_token": token, "input": {"prompt": "go", "params": params}}
    started = time.perf_counter()
    r = c.post(f"/v1/runs/{run_id}/steps", json=body)
    assert r.status_code == 202, r.text
    step = ended_step(c, r.json()["step_id"])
    assert step["status"] == "succeeded" and step["usage"]["tokens_out"] == 2000, step
    return time.perf_counter() - started


def test_four_gates_waiting_over_5000_facts_leave_a_streaming_call_alone(
    tmp_path: Path,
) -> None:
    with serve(tmp_path, "--engine", "sim", env=SIM) as server, _client(server.url) as c:
        run_id = _run(c)
        _insert_facts(tmp_path / "orchestratord.db", run_id, 5000)
        alone = _call_s(c, run_id, "alone")
        cpu_before, rss_before = server.cpu_s(), server.rss_mb()
        with poller(server.url) as probes:
            expr = 'facts.exists(f, f.type == "done")'
            gates = [_gate(c, run_id, f"g{g}", expr, wait_ms=120_000) for g in range(4)]
            for r in gates:
                assert r.status_code == 202, r.text
            time.sleep(1.0)  # each has read the 5,000 facts once, and waits
            beside = _call_s(c, run_id, "beside")
            _fact(c, run_id, "done", {})
            for r in gates:
                assert ended_step(c, r.json()["step_id"])["output"]["result"] is True
        cpu, growth = server.cpu_s() - cpu_before, server.rss_mb() - rss_before
    print(
        f"llm_call of 2,000 tokens: {alone:.2f} s alone, {beside:.2f} s beside four gates;"
        f" server CPU {cpu:.1f} s, RSS growth {growth:.0f} MB"
    )
    probes.report.check("four gates waiting over 5,000 facts, a call streaming")
    assert beside < max(2.0, 4 * alone)
    assert growth < RSS_GROWTH_MB
