"""SQLite on a small file system that fills up, under a real ``orchestratord serve``.

The database lives on a tmpfs of a few MiB mounted by the test (root only); a file written
beside it takes every free byte while a step streams. Then new work is refused with 507
``STORAGE_FULL`` (retriable, with ``Retry-After``), nothing half-stored; everything
committed before reads back as it was, the step that was streaming keeps the tokens it
committed and ends once space is freed, and new work runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chaos.servers import Followed, Server, assert_whole, follow, serving

pytestmark = pytest.mark.slow

# more than SQLite's write-ahead log grows to before it is checkpointed (1000 pages, 4 MiB):
# on a smaller disk the log alone fills it
SIZE = "16m"
BIG = "x" * 256 * 1024  # a flow this large takes 256 KiB of the log
LEASE_S = 2.0
FULL_S = 3.0
ENV = {
    "ORCHESTRATORD_SIM__TOKENS_PER_S": "20",
    "ORCHESTRATORD_SIM__EOS_PROBABILITY": "0",
    "ORCHESTRATORD_DISPATCH__LEASE_S": str(LEASE_S),
    "ORCHESTRATORD_DISPATCH__POLL_S": "0.2",
    "ORCHESTRATORD_LOG_LEVEL": "warning",
}
TERMINAL = ("succeeded", "failed", "cancelled")


def _require_root() -> None:
    problem = None
    if os.geteuid() != 0:
        problem = "mounting a small tmpfs needs root"
    elif shutil.which("mount") is None or shutil.which("umount") is None:
        problem = "mount and umount are not installed"
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{problem}; CI=true requires it", pytrace=False)
    pytest.skip(problem)


@pytest.fixture
def small_fs() -> Iterator[Path]:
    """A tmpfs of ``SIZE``, unmounted (lazily, whatever still holds it) and removed after."""
    _require_root()
    where = Path(tempfile.mkdtemp(prefix="orch-chaos-fs-"))
    mounted = False
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(where)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        mounted = True
        yield where
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)
        shutil.rmtree(where, ignore_errors=True)


def fill(where: Path) -> Path:
    """A file taking every free byte of the file system ``where`` is on."""
    filler = where / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as out:
        for size in (65536, 4096, 512, 1):
            while True:
                try:
                    out.write(chunk[:size])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return filler


def _step(token: str, max_tokens: int) -> dict[str, Any]:
    return {
        "type": "llm_call",
        "client_token": token,
        "input": {"prompt": f"disk {token}", "params": {"max_tokens": max_tokens}},
    }


async def test_sqlite_full_disk_refuses_new_work_and_loses_nothing(
    small_fs: Path, tmp_path: Path
) -> None:
    db_file = small_fs / "orch.db"
    async with serving(tmp_path, f"sqlite:///{db_file}", ["s0"], ENV) as servers:
        try:
            await _scenario(small_fs, servers["s0"])
        except BaseException:
            print(f"--- server log ---\n{servers['s0'].log_tail()}")
            raise
    # the server stopped: the file is whole
    with contextlib.closing(sqlite3.connect(db_file)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def _scenario(fs: Path, server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
        r = await c.post("/v1/flows", json={"ast": {"chaos": "full-disk"}})
        assert r.status_code == 201, r.text
        flow_id = r.json()["flow_id"]
        r = await c.post(f"/v1/flows/{flow_id}/runs", json={"seed": 9})
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        steps_url = f"/v1/runs/{run_id}/steps"

        # committed before the disk fills: three steps, ended
        before = []
        for i in range(3):
            r = await c.post(steps_url, json=_step(f"before-{i}", 8))
            assert r.status_code == 202, r.text
            before.append(r.json()["step_id"])
        logs = {sid: (await follow(c, sid, within_s=20)).events for sid in before}
        records = {sid: (await c.get(f"/v1/steps/{sid}")).json() for sid in before}
        assert all(rec["status"] == "succeeded" for rec in records.values()), records

        # one streaming when it fills (200 tokens at 20/s)
        r = await c.post(steps_url, json=_step("streaming", 200))
        assert r.status_code == 202, r.text
        streaming = r.json()["step_id"]
        seen = Followed(streaming)
        following = asyncio.create_task(follow(c, streaming, within_s=40, out=seen))
        deadline = time.monotonic() + 10
        while sum(e.event == "token" for e in seen.events) < 5:
            assert time.monotonic() < deadline, "the step streamed nothing"
            await asyncio.sleep(0.05)

        filler = await asyncio.to_thread(fill, fs)

        # new work is refused with a clear error, and stores nothing. SQLite's write-ahead
        # log reuses the pages it already holds: what fits there is still taken (large
        # flows take it), then nothing more
        flows: dict[str, Any] = {}
        for i in range(100):
            r = await c.post("/v1/flows", json={"ast": {"big": BIG, "i": i}})
            if r.status_code != 201:
                _assert_full(r)
                break
            flows[r.json()["flow_id"]] = r.json()
        else:
            raise AssertionError(f"{len(flows)} flows of 256 KiB stored on a full disk")
        accepted: list[str] = []
        refused: list[str] = []
        for i in range(200):
            token = f"during-{i}"
            r = await c.post(steps_url, json=_step(token, 4))
            if r.status_code == 202:
                accepted.append(r.json()["step_id"])
                continue
            _assert_full(r)
            refused.append(token)
            if len(refused) == 3:
                break
        assert len(refused) == 3, f"{len(accepted)} submissions accepted on a full disk"
        # what was committed reads back as it was
        for sid in before:
            assert (await c.get(f"/v1/steps/{sid}")).json() == records[sid]
            assert (await follow(c, sid, within_s=10)).events == logs[sid]

        # full for long enough that the streaming step's tokens find no room either
        await asyncio.sleep(FULL_S)
        _assert_full(await c.post(steps_url, json=_step("late", 4)))
        refused.append("late")

        # space again: everything accepted ends, the streaming step with what it committed
        filler.unlink()
        followed = await following
        assert_whole(followed)
        ended = (await c.get(f"/v1/steps/{streaming}")).json()
        assert ended["status"] in TERMINAL, ended
        tokens = [e.data for e in followed.events if e.event == "token"]
        assert tokens, followed.events
        if ended["status"] == "succeeded":
            assert len(tokens) == 200
        # the record keeps the text its stream said (an end made after the process lost
        # the step included)
        assert ended["output"]["text"] == "".join(t["t"] for t in tokens if t), ended
        for sid in accepted:
            assert_whole(await follow(c, sid, within_s=20))
            assert (await c.get(f"/v1/steps/{sid}")).json()["status"] in TERMINAL
        # none of the refused was stored: each is new now, and runs
        for token in refused:
            r = await c.post(steps_url, json=_step(token, 4))
            assert r.status_code == 202, r.text
            assert_whole(await follow(c, r.json()["step_id"], within_s=20))
        for sid in before:
            assert (await c.get(f"/v1/steps/{sid}")).json() == records[sid]
        for flow_id, created in flows.items():
            r = await c.get(f"/v1/flows/{flow_id}")
            assert r.status_code == 200 and r.json()["hash"] == created["hash"], r.text
        print(
            f"streaming step: {ended['status']} {ended.get('error')}, {len(tokens)} tokens kept; "
            f"{len(flows)} flows and {len(accepted)} steps still fitted in the log"
        )


def _assert_full(r: httpx.Response) -> None:
    assert r.status_code == 507, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == "STORAGE_FULL", body
    assert body["retriable"] is True and body["retry_after_ms"] >= 1000, body
    assert int(r.headers["retry-after"]) >= 1, r.headers
