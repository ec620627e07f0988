"""Hostile input, before and after: per attack, how long the server kept others waiting.

Each attack runs against a fresh ``serve --engine sim`` of each checkout given, while a
``/healthz`` poller (its own process, every 50 ms) measures the waits of everyone else. After
the attack's requests are answered (or its client gave up), the poller goes on until the
server's CPU falls idle: a server still grinding through a request whose client left is
still keeping others waiting. Per attack and checkout it prints what the attacker got, the
poller's p99 and longest wait, the server's CPU seconds and its peak RSS growth.

    .venv/bin/python bench/hostile.py --trees /tmp/before . [--only tool_pattern,...]

Sizes are chosen so a checkout without the guards answers within about a minute (the
issue's figures are larger: ``--scale`` multiplies the sizes that grow linearly). Writes
``bench/results/hostile.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from test_harness.probes import PollReport, cpu_s, peak_rss_mb, poller, rss_mb  # noqa: E402

CLIENT_TIMEOUT_S = 90.0
IDLE_WAIT_S = 120.0


@dataclass
class Target:
    url: str
    data: Path
    client: httpx.Client

    def flow(self, **body: Any) -> str:
        r = self.client.post("/v1/flows", json={"ast": {"bench": "hostile"}, **body})
        r.raise_for_status()
        return str(r.json()["flow_id"])

    def run(self, flow_id: str, **body: Any) -> str:
        r = self.client.post(f"/v1/flows/{flow_id}/runs", json={"seed": 1, **body})
        r.raise_for_status()
        return str(r.json()["run_id"])

    def step(self, run_id: str, body: dict[str, Any]) -> httpx.Response:
        return self.client.post(f"/v1/runs/{run_id}/steps", json=body)

    def ended(self, step_id: str) -> dict[str, Any]:
        self.client.get(f"/v1/steps/{step_id}/stream")  # closes after the step's end
        body: dict[str, Any] = self.client.get(f"/v1/steps/{step_id}").json()
        return body


def _said(r: httpx.Response) -> str:
    """What the attacker got: the status, and the error's code and field, or the step's end."""
    if r.status_code >= 400:
        try:
            body = r.json()
        except ValueError:
            return f"{r.status_code} ({len(r.content)} bytes)"
        where = body.get("details", {}).get("field") or body.get("field") or ""
        return f"{r.status_code} {body.get('code', '')} {where} ({len(r.content)} bytes)".strip()
    return str(r.status_code)


def _step_end(t: Target, r: httpx.Response) -> str:
    if r.status_code >= 400:
        return _said(r)
    step = t.ended(r.json()["step_id"])
    error = step.get("error") or {}
    return f"step {step['status']} {error.get('code', '')}".strip()


def _tool(parameters: dict[str, Any]) -> dict[str, Any]:
    executor = {"kind": "builtin", "name": "echo"}
    return {"name": "t", "description": "echo", "executor": executor, "parameters": parameters}


def _tool_call(t: Target, parameters: dict[str, Any], args: Any, **run: Any) -> str:
    r = t.client.post("/v1/flows", json={"ast": {"bench": "hostile"}, "tools": [_tool(parameters)]})
    if r.status_code >= 400:
        return "flow " + _said(r)
    run_id = t.run(r.json()["flow_id"], **run)
    body = {"type": "tool_call", "client_token": "a", "input": {"tool": "t", "args": args}}
    return _step_end(t, t.step(run_id, body))


# -- the attacks ---------------------------------------------------------------------------


def tool_pattern(t: Target, scale: int) -> str:
    """A tool parameter's catastrophic ``pattern`` and args that make it backtrack."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    return _tool_call(t, schema, {"s": "a" * 25 + "b"})


def fact_pattern(t: Target, scale: int) -> str:
    """The same pattern in a flow's ``config.fact_schemas``, and a fact that backtracks."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    r = t.client.post(
        "/v1/flows", json={"ast": {"bench": "hostile"}, "config": {"fact_schemas": {"n": schema}}}
    )
    if r.status_code >= 400:
        return "flow " + _said(r)
    run_id = t.run(r.json()["flow_id"])
    return _said(
        t.client.post(f"/v1/runs/{run_id}/facts", json={"type": "n", "data": {"s": "a" * 25 + "b"}})
    )


def redact_pattern(t: Target, scale: int) -> str:
    """A run's redact rule ``(a+)+$`` over a tool call's args."""
    rules = [{"id": "r", "effect": "redact", "pattern": "(a+)+$"}]
    schema = {"type": "object", "properties": {"s": {"type": "string"}}}
    r = t.client.post("/v1/flows", json={"ast": {"bench": "hostile"}, "tools": [_tool(schema)]})
    r.raise_for_status()
    rr = t.client.post(
        f"/v1/flows/{r.json()['flow_id']}/runs", json={"seed": 1, "policy": {"rules": rules}}
    )
    if rr.status_code >= 400:
        return "run " + _said(rr)
    body = {"type": "tool_call", "client_token": "a"}
    body["input"] = {"tool": "t", "args": {"s": "a" * 24 * scale + "b"}}
    return _step_end(t, t.step(rr.json()["run_id"], body))


def fs_glob(t: Target, scale: int) -> str:
    """An fs deny glob of many ``**`` against a 70-character path."""
    policy = {"roots": [str(t.data / "files")], "deny": ["**a**a**a**a**a**a**b"]}
    rr = t.client.post(f"/v1/flows/{t.flow()}/runs", json={"seed": 1, "fs_policy": policy})
    if rr.status_code >= 400:
        return "run " + _said(rr)
    body = {"type": "fs_op", "client_token": "a"}
    body["input"] = {"op": "write", "path": "a" * 70, "content": "x"}
    return _step_end(t, t.step(rr.json()["run_id"], body))


def ref_doubling(t: Target, scale: int) -> str:
    """A schema under 1 KB whose ``$ref``s double at each of 16 levels; valid args."""
    depth = 16
    defs: dict[str, Any] = {f"a{depth}": {"type": "string"}}
    for i in range(depth):
        ref = {"$ref": f"#/$defs/a{i + 1}"}
        defs[f"a{i}"] = {"allOf": [ref, dict(ref)]}
    schema = {
        "type": "object",
        "$defs": defs,
        "properties": {"s": {"$ref": "#/$defs/a0"}},
    }
    return _tool_call(t, schema, {"s": "x"})


def unique_items(t: Target, scale: int) -> str:
    """``uniqueItems`` over 3,000 distinct objects (quadratic)."""
    schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    return _tool_call(t, schema, {"xs": [{"k": i} for i in range(3000 * scale)]})


def many_keys(t: Target, scale: int) -> str:
    """Invalid args with 200,000 keys: every one an error."""
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    return _tool_call(t, schema, {f"k{i}": "x" for i in range(200_000)})


def refused_keys(t: Target, scale: int) -> str:
    """30 loopback addresses, 50 refused keys each, naming one key id."""
    guess = {"Authorization": f"Bearer ok_{'0' * 12}_{'A' * 43}"}
    codes: dict[int, int] = {}
    for n in range(30):
        transport = httpx.HTTPTransport(local_address=f"127.0.0.{n + 2}")
        with httpx.Client(transport=transport, base_url=t.url, timeout=CLIENT_TIMEOUT_S) as c:
            for _ in range(50):
                code = c.get("/v1/runs", headers=guess).status_code
                codes[code] = codes.get(code, 0) + 1
    return ", ".join(f"{n} x {code}" for code, n in sorted(codes.items()))


def cel_values(t: Target, scale: int) -> str:
    """A gate whose comprehensions build 1,536 copies of a doubled 200 KB fact."""
    run_id = t.run(t.flow())
    fact = {"type": "big", "data": {"s": "x" * 200_000 * scale}}
    t.client.post(f"/v1/runs/{run_id}/facts", json=fact).raise_for_status()
    xs, ys = list(range(48)), list(range(32))
    expr = f"{xs}.map(x, {ys}.map(y, facts[0].data.s + facts[0].data.s)).size() > 0"
    body = {"type": "gate_eval", "client_token": "g", "input": {"expr": expr}}
    return _step_end(t, t.step(run_id, body))


def waiting_gates(t: Target, scale: int) -> str:
    """Four gates waiting over 5,000 facts while a 2,000-token llm_call streams in the run."""
    run_id = t.run(t.flow())
    for i in range(5000):
        fact = {"type": "n", "data": {"i": i}}
        t.client.post(f"/v1/runs/{run_id}/facts", json=fact).raise_for_status()
    expr = 'facts.exists(f, f.type == "done")'
    for g in range(4):
        gate = {"type": "gate_eval", "client_token": f"g{g}"}
        gate["input"] = {"expr": expr, "wait_ms": 120_000}
        t.step(run_id, gate).raise_for_status()
    call = {"type": "llm_call", "client_token": "c"}
    call["input"] = {"prompt": "go", "params": {"max_tokens": 2000, "temperature": 0}}
    t0 = time.perf_counter()
    r = t.step(run_id, call)
    end = _step_end(t, r)
    took = time.perf_counter() - t0
    t.client.post(f"/v1/runs/{run_id}/facts", json={"type": "done", "data": {}})
    return f"llm_call of 2,000 tokens: {end} in {took:.2f} s"


def fs_proc_root(t: Target, scale: int) -> str:
    """A run whose fs root is ``/proc/self``, then a read of ``environ``."""
    rr = t.client.post(
        f"/v1/flows/{t.flow()}/runs", json={"seed": 1, "fs_policy": {"roots": ["/proc/self"]}}
    )
    if rr.status_code >= 400:
        return "run " + _said(rr)
    body = {"type": "fs_op", "client_token": "a", "input": {"op": "read", "path": "environ"}}
    r = t.step(rr.json()["run_id"], body)
    r.raise_for_status()
    step = t.ended(r.json()["step_id"])
    if step["status"] != "succeeded":
        return f"step {step['status']} {(step.get('error') or {}).get('code', '')}"
    return f"read {step['output']['size']} bytes of the server's environment"


def fs_quota_race(t: Target, scale: int) -> str:
    """40 writes of 25 KB at once into a root whose quota is 250 KB (room for 10)."""
    root = t.data / "files" / "quota"
    root.mkdir(parents=True, exist_ok=True)
    policy = {"roots": [str(root)], "quota_bytes": 250_000}
    run_id = t.run(t.flow(), fs_policy=policy)

    def write(n: int) -> str:
        inp = {"op": "write", "path": f"f{n}.txt", "content": "x" * 25_000}
        r = t.step(run_id, {"type": "fs_op", "client_token": f"w{n}", "input": inp})
        r.raise_for_status()
        return str(r.json()["step_id"])

    with ThreadPoolExecutor(max_workers=40) as pool:
        ids = list(pool.map(write, range(40)))
    for step_id in ids:
        t.ended(step_id)
    stored = [p for p in root.iterdir() if not p.name.startswith(".~fs-")]
    size = sum(p.stat().st_size for p in stored)
    return f"{len(stored)} files, {size:,} bytes stored (quota 250,000)"


@dataclass
class Attack:
    name: str
    run: Callable[[Target, int], str]
    env: dict[str, str] = field(default_factory=dict)
    auth: bool = False


ATTACKS = [
    Attack("tool_pattern", tool_pattern),
    Attack("fact_pattern", fact_pattern),
    Attack("redact_pattern", redact_pattern),
    Attack("fs_glob", fs_glob),
    Attack("fs_proc_root", fs_proc_root),
    Attack("fs_quota_race", fs_quota_race, env={"ORCHESTRATORD_BREAKERS__TOOL_FAILURES": "1000"}),
    Attack("ref_doubling", ref_doubling),
    Attack("unique_items", unique_items),
    Attack("many_keys", many_keys),
    Attack("cel_values", cel_values),
    Attack(
        "waiting_gates",
        waiting_gates,
        env={"ORCHESTRATORD_SIM__TOKENS_PER_S": "0", "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0"},
    ),
    Attack(
        "refused_keys",
        refused_keys,
        env={"ORCHESTRATORD_AUTH__LIMITED_WAIT_S": "0"},
        auth=True,
    ),
]


# -- the measure ---------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(argv: list[str], cwd: Path, env: dict[str, str], ready: str) -> Iterator[int]:
    """``argv`` running in ``cwd`` until the block ends, once ``ready`` answers 200; its pid."""
    log = (cwd / f"{Path(argv[2]).name}-{time.monotonic_ns()}.log").open("wb")
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{argv[:4]} exited: {Path(log.name).read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready, timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"{argv[:4]} not ready")
            time.sleep(0.1)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def _server(tree: Path, data: Path, attack: Attack) -> Iterator[tuple[str, int]]:
    port = _free_port()
    files = data / "files"
    files.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "ORCHESTRATORD_DATA_DIR": str(data),
        "ORCHESTRATORD_FS__ALLOWED_ROOTS": str(files),
        **attack.env,
    }
    argv = [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim", "--port", str(port)]
    argv += ["--database-url", f"sqlite:///{data / 'o.db'}"]
    if attack.auth:
        argv.append("--auth")
    url = f"http://127.0.0.1:{port}"
    with process(argv, data, env, url + "/healthz") as pid:
        yield url, pid


def _until_idle(pid: int) -> None:
    """Until the server's CPU falls idle (under 5% of a core over half a second)."""
    deadline = time.monotonic() + IDLE_WAIT_S
    last = cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = cpu_s(pid)
        if now - last < 0.025:
            return
        last = now


def measure(tree: Path, attack: Attack, scale: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        with (
            _server(tree, data, attack) as (url, pid),
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as client,
        ):
            target = Target(url, data, client)
            rss0, cpu0 = rss_mb(pid), cpu_s(pid)
            t0 = time.perf_counter()
            with poller(url) as probes:
                try:
                    outcome = attack.run(target, scale)
                except httpx.TimeoutException:
                    outcome = f"client gave up after {CLIENT_TIMEOUT_S:.0f} s"
                wall = time.perf_counter() - t0
                _until_idle(pid)
            report: PollReport = probes.report
            return {
                "outcome": outcome,
                "wall_s": round(wall, 2),
                "poll_p99_ms": round(report.p99_s * 1000, 1),
                "poll_max_ms": round(report.max_s * 1000, 1),
                "probes": report.count,
                "server_cpu_s": round(cpu_s(pid) - cpu0, 2),
                "rss_growth_mb": round(rss_mb(pid) - rss0, 1),
                "peak_rss_growth_mb": round(peak_rss_mb(pid) - rss0, 1),
            }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", nargs="*", default=[str(ROOT)], help="checkouts to measure")
    ap.add_argument("--only", help="comma-separated attack names")
    ap.add_argument("--scale", type=int, default=1, help="multiplies the linear sizes")
    a = ap.parse_args()
    trees = [Path(t).resolve() for t in a.trees]
    chosen = [x for x in ATTACKS if not a.only or x.name in a.only.split(",")]
    results: dict[str, dict[str, Any]] = {}
    for attack in chosen:
        for tree in trees:
            row = measure(tree, attack, a.scale)
            results.setdefault(attack.name, {})[str(tree)] = row
            print(
                f"{attack.name:<16} {tree.name or str(tree):<10} p99 {row['poll_p99_ms']:>8} ms"
                f"  max {row['poll_max_ms']:>8} ms  cpu {row['server_cpu_s']:>6} s"
                f"  peak rss +{row['peak_rss_growth_mb']:>6} MB  {row['outcome']}",
                flush=True,
            )
    out = ROOT / "bench" / "results" / "hostile.json"
    out.write_text(json.dumps({"trees": [str(t) for t in trees], "attacks": results}, indent=2))


if __name__ == "__main__":
    main()
