"""The file system belongs to the operator, against a real ``serve``: a run's roots must lie
beneath ``fs.allowed_roots`` (HTTP and the Evergreen door); /proc, /sys, /dev and the
server's database and log are out of reach even when ``/`` is allowed, and the database
survives the attempt; hard links are refused; quotas hold under 40 concurrent writes. A
``/healthz`` poller runs through each."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import httpx
import pytest

from tests.evergreen.upstream import metadata, sent, start
from tests.hostile import poller, serve
from tests.procs import ended_step, free_port

pytestmark = pytest.mark.slow
FAILURES = "1000"  # refusals a run may meet before its fs breaker opens: each one is looked at


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60)


def _flow(c: httpx.Client) -> str:
    r = c.post("/v1/flows", json={"ast": {"fs": 1}})
    assert r.status_code == 201, r.text
    flow_id: str = r.json()["flow_id"]
    return flow_id


def _run(c: httpx.Client, flow_id: str, **fs_policy: Any) -> httpx.Response:
    return c.post(f"/v1/flows/{flow_id}/runs", json={"seed": 1, "fs_policy": fs_policy})


def _run_id(c: httpx.Client, flow_id: str, **fs_policy: Any) -> str:
    r = _run(c, flow_id, **fs_policy)
    assert r.status_code == 201, r.text
    run_id: str = r.json()["run_id"]
    return run_id


def _refused(r: httpx.Response, field: str) -> str:
    """The reason of a 422 that names ``field``."""
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["details"]["errors"][0]["field"] == field, body
    reason: str = body["details"]["reason"]
    return reason


def _submit(c: httpx.Client, run_id: str, token: str, **inp: Any) -> str:
    r = c.post(
        f"/v1/runs/{run_id}/steps", json={"type": "fs_op", "client_token": token, "input": inp}
    )
    assert r.status_code == 202, r.text
    step_id: str = r.json()["step_id"]
    return step_id


def _fs(c: httpx.Client, run_id: str, token: str, **inp: Any) -> dict[str, Any]:
    return ended_step(c, _submit(c, run_id, token, **inp))


def _violation(step: dict[str, Any]) -> str:
    assert step["status"] == "failed", step
    assert step["error"]["code"] == "FS_POLICY_VIOLATION", step["error"]
    reason: str = step["error"]["details"]["reason"]
    return reason


def test_roots_outside_the_operator_s_are_refused_at_both_doors(tmp_path: Path) -> None:
    files = tmp_path / "orchestratord-data" / "files"  # the default allowed root
    port = free_port()
    with (
        serve(tmp_path, "--engine", "sim", "--evergreen-port", str(port)) as server,
        poller(server.url) as probes,
        _client(server.url) as c,
    ):
        assert files.is_dir()  # made at start
        (files / "to-etc").symlink_to("/etc")
        (tmp_path / "to-proc").symlink_to("/proc")
        flow_id = _flow(c)
        cases = [
            (["/proc/self"], 0, "protected"),
            ([str(files), "/"], 1, "root_not_allowed"),
            (["/etc"], 0, "root_not_allowed"),
            ([f"{files}/../../orchestratord.db"], 0, "protected"),
            ([str(files / "to-etc")], 0, "root_not_allowed"),  # a link out of the allowed root
            ([str(tmp_path / "to-proc" / "self")], 0, "protected"),
            ([str(files / "sub"), "/sys"], 1, "protected"),
        ]
        for roots, i, reason in cases:
            r = _run(c, flow_id, roots=roots)
            assert _refused(r, f"fs_policy.roots[{i}]") == reason, (roots, r.text)
        assert _run(c, flow_id, roots=["files"]).status_code == 422  # relative: whose?

        out = asyncio.run(
            start(port, metadata(flow_id, {"fs_policy": {"roots": ["/proc/self"]}}), sent())
        )
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT, out.details
        assert out.error["details"]["errors"][0]["field"] == "fs_policy.roots[0]"

        run_id = _run_id(c, flow_id, roots=[str(files)])
        wrote = _fs(c, run_id, "w", op="write", path="a.txt", content="inside")
        assert wrote["status"] == "succeeded", wrote
        assert (files / "a.txt").read_text() == "inside"
    probes.report.check("runs with roots out of bounds")


def test_with_every_root_allowed_the_server_s_own_files_stay_out_of_reach(
    tmp_path: Path,
) -> None:
    env = {
        "ORCHESTRATORD_FS__ALLOWED_ROOTS": "/",
        "ORCHESTRATORD_BREAKERS__TOOL_FAILURES": FAILURES,
    }
    data = tmp_path / "data"
    data.mkdir()
    db = tmp_path / "orchestratord.db"
    with (
        serve(tmp_path, "--engine", "sim", env=env) as server,
        poller(server.url) as probes,
        _client(server.url) as c,
    ):
        flow_id = _flow(c)
        kept = {_run_id(c, flow_id) for _ in range(5)}
        (tmp_path / "to-proc").symlink_to("/proc")
        for root in ["/proc/self", "/sys", "/dev", "/dev/shm", str(tmp_path / "to-proc"), str(db)]:
            r = _run(c, flow_id, roots=[root])
            assert _refused(r, "fs_policy.roots[0]") == "protected", (root, r.text)
        everything = _run_id(c, flow_id, roots=["/"])
        log = next(tmp_path.glob("proc-*.log"))
        attempts = [
            {"op": "read", "path": "/proc/self/environ"},
            {"op": "read", "path": "proc/self/environ"},
            {"op": "list", "path": "/sys"},
            {"op": "read", "path": "/dev/null"},
            {"op": "write", "path": "/dev/shm/x", "content": "x"},
            {"op": "read", "path": str(db)},
            {"op": "stat", "path": str(db)},
            {"op": "write", "path": str(db), "content": "gone"},
            {"op": "delete", "path": str(db)},
            {"op": "delete", "path": f"{db}-wal"},
            {"op": "delete", "path": f"{db}-shm"},
            {"op": "write", "path": f"{db}-journal", "content": "hot journal"},
            {"op": "write", "path": f"{db}-journal/x", "content": "a directory in its way"},
            {"op": "read", "path": str(log)},
            {"op": "write", "path": str(log), "content": "forged"},
        ]
        for n, inp in enumerate(attempts):
            assert _violation(_fs(c, everything, f"a{n}", **inp)) == "protected", inp
        assert not (tmp_path / "orchestratord.db-journal").exists()

        # a run stored while data was allowed
        stored = _run_id(c, flow_id, roots=[str(data)])
        assert _fs(c, stored, "w", op="write", path="a.txt", content="x")["status"] == "succeeded"
        r = c.post(f"/v1/runs/{stored}/checkpoint", json={"state": {"k": 1}})
        assert r.status_code in (200, 201), r.text
        checkpoint_id = r.json()["checkpoint_id"]
    probes.report.check("fs_op on protected places with / allowed")

    # the server comes back with its runs: nothing above reached its database
    with serve(tmp_path, "--engine", "sim") as server, _client(server.url) as c:
        listed = {run["run_id"] for run in c.get("/v1/runs", params={"flow_id": flow_id}).json()}
        assert kept | {everything, stored} <= listed
        # now that data is out of bounds, the stored run reaches nothing, nor its forks or replays
        assert _violation(_fs(c, stored, "r", op="read", path="a.txt")) == "root_not_allowed"
        fork = c.post(f"/v1/runs/{stored}/fork", json={"checkpoint_id": checkpoint_id})
        assert _refused(fork, "fs_policy.roots[0]") == "root_not_allowed"
        replay = c.post(
            f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": stored}
        )
        assert _refused(replay, "fs_policy.roots[0]") == "root_not_allowed"


def test_a_hard_link_is_refused(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "root").mkdir(parents=True)
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("outside")
    os.link(secret, allowed / "root" / "link.txt")
    env = {"ORCHESTRATORD_FS__ALLOWED_ROOTS": str(allowed)}
    with (
        serve(tmp_path, "--engine", "sim", env=env) as server,
        poller(server.url) as probes,
        _client(server.url) as c,
    ):
        os.link(tmp_path / "orchestratord.db", allowed / "root" / "db")  # made at start
        run_id = _run_id(c, _flow(c), roots=[str(allowed / "root")])
        for n, inp in enumerate(
            [
                {"op": "read", "path": "link.txt"},
                {"op": "stat", "path": "link.txt"},
                {"op": "write", "path": "link.txt", "content": "over"},
                {"op": "delete", "path": "link.txt"},
            ]
        ):
            assert _violation(_fs(c, run_id, f"h{n}", **inp)) == "hardlink", inp
        # the database's own inode, under another name: refused as the database is
        assert _violation(_fs(c, run_id, "db", op="read", path="db")) == "protected"
        assert secret.read_text() == "outside"
        assert (allowed / "root" / "link.txt").stat().st_nlink == 2
    probes.report.check("hard links")


@pytest.fixture
def quota_server(tmp_path: Path) -> Iterator[tuple[httpx.Client, Path]]:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    env = {
        "ORCHESTRATORD_FS__ALLOWED_ROOTS": str(allowed),
        "ORCHESTRATORD_BREAKERS__TOOL_FAILURES": FAILURES,
    }
    with serve(tmp_path, "--engine", "sim", env=env) as server, _client(server.url) as c:
        yield c, allowed


def _at_once(c: httpx.Client, run_id: str, writes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``writes`` submitted together from 40 threads, then each one's end."""
    with ThreadPoolExecutor(max_workers=40) as pool:
        ids = list(pool.map(lambda n: _submit(c, run_id, f"q{n}", **writes[n]), range(len(writes))))
    return [ended_step(c, step_id) for step_id in ids]


def test_quotas_hold_under_40_concurrent_writes(quota_server: tuple[httpx.Client, Path]) -> None:
    c, allowed = quota_server
    flow_id = _flow(c)
    by_bytes, by_files = allowed / "bytes", allowed / "files"
    by_bytes.mkdir()
    by_files.mkdir()
    with poller(str(c.base_url).rstrip("/")) as probes:
        run_id = _run_id(c, flow_id, roots=[str(by_bytes)], quota_bytes=25_000)
        big = "x" * 2_500
        ends = _at_once(
            c, run_id, [{"op": "write", "path": f"f{n}.txt", "content": big} for n in range(40)]
        )
        stored = sum(p.stat().st_size for p in by_bytes.rglob("*") if p.is_file())
        assert stored <= 25_000
        assert sum(e["status"] == "succeeded" for e in ends) == 10  # exactly what fits
        assert {_violation(e) for e in ends if e["status"] != "succeeded"} == {"quota"}

        run_id = _run_id(c, flow_id, roots=[str(by_files)], quota_files=3)
        ends = _at_once(
            c, run_id, [{"op": "write", "path": f"n{n}.txt", "content": "x"} for n in range(40)]
        )
        assert len([p for p in by_files.iterdir() if not p.name.startswith(".~fs-")]) == 3
        assert sum(e["status"] == "succeeded" for e in ends) == 3
    probes.report.check("40 concurrent writes under quotas")


def test_serve_stops_on_an_allowed_root_in_proc(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHESTRATORD_FS__ALLOWED_ROOTS": "/srv,/proc/self"}
    done = subprocess.run(
        [sys.executable, "-m", "orchestratord", "serve", "--engine", "sim", "--port", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("orchestratord: bad setting ORCHESTRATORD_FS__ALLOWED_ROOTS"), line
    assert "never reachable" in line
