"""Hostile engines, before and after: per attack, what the step became and what the server
spent on it.

One ``test_harness.hostile_openai`` engine process (this checkout's) serves every checkout
given; each attack runs against a fresh ``serve --pools`` of each checkout, whose one pool
is that engine, while a ``/healthz`` poller (its own process, every 50 ms) measures the waits
of everyone else. After the step ends (or the client gives up waiting for it), the poller goes
on until the server's CPU falls idle. Per attack and checkout it prints the step's end, the
bytes of its row as ``GET /v1/steps/{id}`` shows it, the poller's p99 and longest wait, the
server's CPU seconds and its peak RSS growth.

    .venv/bin/python bench/hostile_engines.py --trees /tmp/before . [--only huge_token,...]

Writes ``bench/results/hostile_engines.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.hostile import _free_port, _until_idle, process  # noqa: E402
from test_harness.probes import cpu_s, peak_rss_mb, poller, rss_mb  # noqa: E402

WAIT_S = 60.0  # the most the client waits for a step's end


@dataclass(frozen=True)
class Attack:
    name: str
    prompt: str
    env: dict[str, str] = field(default_factory=dict)


ATTACKS = [
    Attack("huge_token", "huge-token 100"),  # one 100 MB token
    Attack("huge_error", "huge-error 100"),  # an HTTP 500 with a 100 MB body
    # ": ping" every 5 s, no token; an idle timeout shorter than its default (120 s), for the
    # bench's patience (a checkout without the setting ignores it)
    Attack("keep_alives", "trickle 5", {"ORCHESTRATORD_ENGINE_LIMITS__IDLE_TIMEOUT_S": "20"}),
    Attack("retry_after", "busy 429 1 2"),  # 429 Retry-After: 2, then an answer
]


def _outcome(client: httpx.Client, step_id: str) -> str:
    """The step's end as its client sees it, once ended or after ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        r = client.get(f"/v1/steps/{step_id}")
        step = r.json()
        if step["status"] not in ("queued", "running") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    error = step.get("error") or {}
    reason = (error.get("details") or {}).get("reason", "")
    said = f"step {step['status']} {error.get('code', '')} {reason}".split()
    if error.get("retry_after_ms") is not None:
        said.append(f"retry_after_ms={error['retry_after_ms']}")
    if step["status"] in ("queued", "running"):
        said.append(f"after {WAIT_S:.0f} s")
    return " ".join(said) + f" (row {len(r.content)} bytes)"


def measure(tree: Path, engine_url: str, attack: Attack) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        pools = data / "pools.yaml"
        pools.write_text(
            "pools:\n  - pool_id: p\n    engine: openai\n    replicas:\n"
            f"      - {{replica_id: r0, slots: 1, url: '{engine_url}/v1', model: hostile}}\n"
        )
        port = _free_port()
        argv = [sys.executable, "-m", "orchestratord", "serve", "--pools", str(pools)]
        argv += ["--port", str(port), "--database-url", f"sqlite:///{data / 'o.db'}"]
        env = {**os.environ, "PYTHONPATH": str(tree), "ORCHESTRATORD_DATA_DIR": str(data)}
        env.update(attack.env)
        url = f"http://127.0.0.1:{port}"
        with (
            process(argv, data, env, url + "/healthz") as pid,
            httpx.Client(base_url=url, timeout=WAIT_S) as client,
        ):
            flow = client.post("/v1/flows", json={"ast": {"bench": "engines"}}).json()
            run = client.post(f"/v1/flows/{flow['flow_id']}/runs", json={"seed": 1}).json()
            body: dict[str, Any] = {
                "type": "llm_call",
                "client_token": "a",
                "input": {"prompt": f"{attack.prompt} {tree}", "params": {"max_tokens": 16}},
            }
            cpu0, rss0, t0 = cpu_s(pid), rss_mb(pid), time.perf_counter()
            with poller(url) as probes:
                r = client.post(f"/v1/runs/{run['run_id']}/steps", json=body)
                outcome = _outcome(client, r.json()["step_id"])
                wall = time.perf_counter() - t0
                _until_idle(pid)
            report = probes.report
            return {
                "outcome": outcome,
                "wall_s": round(wall, 2),
                "poll_p99_ms": round(report.p99_s * 1000, 1),
                "poll_max_ms": round(report.max_s * 1000, 1),
                "probes": report.count,
                "server_cpu_s": round(cpu_s(pid) - cpu0, 2),
                "peak_rss_growth_mb": round(peak_rss_mb(pid) - rss0, 1),
            }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", nargs="*", default=[str(ROOT)], help="checkouts to measure")
    ap.add_argument("--only", help="comma-separated attack names")
    a = ap.parse_args()
    trees = [Path(t).resolve() for t in a.trees]
    chosen = [x for x in ATTACKS if not a.only or x.name in a.only.split(",")]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        engine = [sys.executable, "-m", "test_harness.hostile_openai", "--port", str(port)]
        engine_url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with process(engine, Path(tmp), env, engine_url + "/health"):
            for attack in chosen:
                for tree in trees:
                    row = measure(tree, engine_url, attack)
                    results.setdefault(attack.name, {})[str(tree)] = row
                    print(
                        f"{attack.name:<12} {tree.name or str(tree):<14}"
                        f" p99 {row['poll_p99_ms']:>8} ms  max {row['poll_max_ms']:>8} ms"
                        f"  cpu {row['server_cpu_s']:>6} s  wall {row['wall_s']:>6} s"
                        f"  peak rss +{row['peak_rss_growth_mb']:>6} MB"
                        f"  {row['outcome']}",
                        flush=True,
                    )
    out = ROOT / "bench" / "results" / "hostile_engines.json"
    out.write_text(json.dumps({"trees": [str(t) for t in trees], "attacks": results}, indent=2))


if __name__ == "__main__":
    main()
