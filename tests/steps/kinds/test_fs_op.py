"""fs_op through HTTP: the broker keeps every path beneath its root, and a table of hostile
inputs never escapes nor touches the files outside."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import make_flow, make_run, wait_status

SECRET = b"outside: do not touch\n"


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    (root / "secrets").mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    (root / "a.txt").write_text("alpha\n")
    (root / "a.bin").write_text("bin")
    (root / ".env").write_text("KEY=1")
    (root / "sub" / "b.txt").write_text("beta\n")
    (root / "link_file").symlink_to(outside / "secret.txt")
    (root / "link_dir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "pipe")
    return {"root": root, "outside": outside}


def outside_untouched(tree: dict[str, Path]) -> None:
    assert (tree["outside"] / "secret.txt").read_bytes() == SECRET
    assert sorted(p.name for p in tree["outside"].iterdir()) == ["secret.txt"]


async def fs(
    client: httpx.AsyncClient, run_id: str, token: str = "f", **inp: Any
) -> dict[str, Any]:
    r = await client.post(
        f"/v1/runs/{run_id}/steps", json={"type": "fs_op", "client_token": token, "input": inp}
    )
    assert r.status_code == 202, r.text
    return await wait_status(client, r.json()["step_id"], "succeeded", "failed")


async def fs_run(client: httpx.AsyncClient, tree: dict[str, Path], **policy: Any) -> str:
    fs_policy = {"roots": [str(tree["root"])], **policy}
    return await make_run(client, fs_policy=fs_policy)


LONG = "a" * 300
HOSTILE: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("dotdot", {"op": "read", "path": "../outside/secret.txt"}, {}, "outside_root"),
    ("dotdot deep", {"op": "read", "path": "sub/../../outside/secret.txt"}, {}, "outside_root"),
    ("dot dotdot", {"op": "read", "path": "sub/./../../outside/secret.txt"}, {}, "outside_root"),
    ("absolute elsewhere", {"op": "read", "path": "/etc/passwd"}, {}, "outside_root"),
    ("absolute outside", {"op": "read", "path": "{outside}/secret.txt"}, {}, "outside_root"),
    ("write dotdot", {"op": "write", "path": "../outside/x", "content": "x"}, {}, "outside_root"),
    ("write as dotdot", {"op": "write", "path": "..", "content": "x"}, {}, "outside_root"),
    ("link to a file", {"op": "read", "path": "link_file"}, {}, "symlink"),
    ("link to a dir", {"op": "read", "path": "link_dir/secret.txt"}, {}, "symlink"),
    (
        "write through a file link",
        {"op": "write", "path": "link_file", "content": "x"},
        {},
        "symlink",
    ),
    (
        "write into a dir link",
        {"op": "write", "path": "link_dir/n.txt", "content": "x"},
        {},
        "symlink",
    ),
    ("delete a link", {"op": "delete", "path": "link_file"}, {}, "symlink"),
    ("list a dir link", {"op": "list", "path": "link_dir"}, {}, "symlink"),
    ("stat a link", {"op": "stat", "path": "link_file"}, {}, "symlink"),
    ("NUL byte", {"op": "read", "path": "a.txt\u0000.png"}, {}, "invalid_path"),
    ("FIFO read", {"op": "read", "path": "pipe"}, {}, "not_regular"),
    ("FIFO write", {"op": "write", "path": "pipe", "content": "x"}, {}, "not_regular"),
    ("FIFO delete", {"op": "delete", "path": "pipe"}, {}, "not_regular"),
    ("deny glob", {"op": "read", "path": ".env"}, {"deny": ["**/*.env", "**/.env"]}, "denied"),
    (
        "deny dir glob",
        {"op": "write", "path": "secrets/k", "content": "x"},
        {"deny": ["secrets/**"]},
        "denied",
    ),
    ("unlisted extension", {"op": "read", "path": "a.bin"}, {"allow": ["**/*.txt"]}, "not_allowed"),
    (
        "quota bytes",
        {"op": "write", "path": "big.txt", "content": "x" * 100},
        {"quota_bytes": 50},
        "quota",
    ),
    (
        "quota files",
        {"op": "write", "path": "new.txt", "content": "x"},
        {"quota_files": 4},
        "quota",
    ),
    ("two-dot leader", {"op": "read", "path": "\u2025/outside/secret.txt"}, {}, "invalid_path"),
    (
        "fullwidth dots",
        {"op": "read", "path": "\uff0e\uff0e/outside/secret.txt"},
        {},
        "invalid_path",
    ),
    ("zero width", {"op": "write", "path": "a\u200b.txt", "content": "x"}, {}, "invalid_path"),
    (
        "right-to-left override",
        {"op": "write", "path": "\u202etxt.exe", "content": "x"},
        {},
        "invalid_path",
    ),
    ("very long name", {"op": "write", "path": LONG, "content": "x"}, {}, "invalid_path"),
    ("very long path", {"op": "read", "path": "a/" * 2100}, {}, "invalid_path"),
    # the broker's temporary names: unlisted and outside quotas, so no path may use them
    (
        "broker temporary name",
        {"op": "write", "path": "d/.~fs-0123abcd", "content": "x" * 100},
        {"quota_bytes": 10},
        "invalid_path",
    ),
]


@pytest.mark.parametrize(
    ("inp", "policy", "reason"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
async def test_hostile_inputs_never_escape(
    client: httpx.AsyncClient,
    tree: dict[str, Path],
    inp: dict[str, Any],
    policy: dict[str, Any],
    reason: str,
) -> None:
    inp = {
        k: v.replace("{outside}", str(tree["outside"])) if isinstance(v, str) else v
        for k, v in inp.items()
    }
    run_id = await fs_run(client, tree, **policy)
    step = await fs(client, run_id, **inp)
    assert step["status"] == "failed", step
    assert step["error"]["code"] == "FS_POLICY_VIOLATION", step["error"]
    assert step["error"]["details"]["reason"] == reason
    outside_untouched(tree)
    assert (tree["root"] / "a.txt").read_text() == "alpha\n"
    assert not [p for p in tree["root"].rglob("*") if p.name.startswith(".~fs-")]


async def test_a_run_without_roots_touches_nothing(client: httpx.AsyncClient) -> None:
    run_id = await make_run(client)
    step = await fs(client, run_id, op="read", path="a.txt")
    assert step["error"]["details"]["reason"] == "no_roots"


async def test_read_write_list_stat_delete(
    client: httpx.AsyncClient, tree: dict[str, Path]
) -> None:
    run_id = await fs_run(client, tree, deny=["**/.env"])
    wrote = await fs(client, run_id, "w", op="write", path="docs/new.md", content="héllo\n")
    assert wrote["status"] == "succeeded", wrote
    digest = "sha256:" + hashlib.sha256("héllo\n".encode()).hexdigest()
    assert wrote["output"] == {"size": 7, "sha256": digest, "stop_reason": "eos"}
    assert (tree["root"] / "docs" / "new.md").read_text() == "héllo\n"
    read = await fs(client, run_id, "r", op="read", path=f"{tree['root']}/docs/new.md")
    assert read["output"]["content"] == "héllo\n" and read["output"]["sha256"] == digest
    listed = await fs(client, run_id, "l", op="list", path=".")
    names = {(e["name"], e["type"]) for e in listed["output"]["entries"]}
    assert ("a.txt", "file") in names and ("docs", "dir") in names and ("sub", "dir") in names
    assert not {n for n, _ in names} & {".env", "link_file", "link_dir", "pipe"}
    st = await fs(client, run_id, "s", op="stat", path="sub/b.txt")
    assert st["output"]["type"] == "file" and st["output"]["size"] == 5
    assert st["output"]["mtime"].endswith("Z")
    gone = await fs(client, run_id, "d", op="delete", path="sub/b.txt")
    assert gone["output"]["deleted"] is True and not (tree["root"] / "sub" / "b.txt").exists()
    missing = await fs(client, run_id, "m", op="read", path="sub/b.txt")
    assert (
        missing["error"]["code"] == "FS_ERROR"
        and missing["error"]["details"]["reason"] == "not_found"
    )


async def test_bad_fs_input_names_the_field(
    client: httpx.AsyncClient, tree: dict[str, Path]
) -> None:
    run_id = await fs_run(client, tree)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "fs_op", "client_token": "x", "input": {"op": "chmod", "path": "a"}},
    )
    assert r.status_code == 422
    assert "input.op" in [e["field"] for e in r.json()["details"]["errors"]]


async def test_policy_rules_match_the_path(
    client: httpx.AsyncClient, tree: dict[str, Path]
) -> None:
    policy = {"rules": [{"id": "no-sub", "effect": "deny", "match": {"path": "sub/**"}}]}
    run_id = await make_run(client, fs_policy={"roots": [str(tree["root"])]}, policy=policy)
    r = await client.post(
        f"/v1/runs/{run_id}/steps",
        json={"type": "fs_op", "client_token": "x", "input": {"op": "read", "path": "sub/b.txt"}},
    )
    assert r.status_code == 403 and "no-sub" in r.json()["message"]


async def test_repeated_violations_open_the_runs_breaker(
    client: httpx.AsyncClient, tree: dict[str, Path]
) -> None:
    run_id = await fs_run(client, tree)
    codes = []
    for i in range(6):
        step = await fs(client, run_id, f"v{i}", op="read", path="../outside/secret.txt")
        codes.append(step["error"]["code"])
    assert codes == ["FS_POLICY_VIOLATION"] * 5 + ["CIRCUIT_OPEN"]
    ok = await fs(client, run_id, "ok", op="read", path="a.txt")
    assert ok["error"]["code"] == "CIRCUIT_OPEN"
    outside_untouched(tree)


def test_a_link_swapped_in_before_the_rename_is_replaced_not_followed(
    tree: dict[str, Path],
) -> None:
    from orchestrator_core.fs import FsRules
    from orchestratord.fs import broker
    from orchestratord.fs.guard import FsGuard

    rules = FsRules.from_policy({"roots": [str(tree["root"])]})

    def swap(dir_fd: int, name: str) -> None:  # the attacker's move, between check and use
        os.unlink(name, dir_fd=dir_fd)
        os.symlink(str(tree["outside"] / "secret.txt"), name, dir_fd=dir_fd)

    broker.before_rename = swap
    try:
        broker.run_op(FsGuard([str(tree["root"])]), rules, "write", "a.txt", "new content")
    finally:
        broker.before_rename = None
    outside_untouched(tree)
    target = tree["root"] / "a.txt"
    assert not target.is_symlink() and target.read_text() == "new content"


def test_a_write_killed_mid_way_leaves_the_old_file_whole(tree: dict[str, Path]) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal
        from orchestrator_core.fs import FsRules
        from orchestratord.fs import broker
        from orchestratord.fs.guard import FsGuard
        broker.before_rename = lambda fd, name: os.kill(os.getpid(), signal.SIGKILL)
        rules = FsRules.from_policy({{"roots": [{str(tree["root"])!r}]}})
        guard = FsGuard([{str(tree["root"])!r}])
        broker.run_op(guard, rules, "write", "a.txt", "x" * 5_000_000)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[3], check=False
    )
    assert proc.returncode == -9
    assert (tree["root"] / "a.txt").read_text() == "alpha\n"  # old content, whole
    leftovers = [p.name for p in tree["root"].iterdir() if p.name.startswith(".~fs-")]
    assert len(leftovers) == 1  # the new content never took the name


async def test_replay_serves_file_results_without_the_disk(
    client: httpx.AsyncClient, tree: dict[str, Path]
) -> None:
    flow_id = await make_flow(client)
    policy = {"roots": [str(tree["root"])]}
    source = await make_run(client, flow_id, fs_policy=policy)
    recorded = await fs(client, source, op="read", path="a.txt")
    (tree["root"] / "a.txt").unlink()  # a replay must not need it
    r = await client.post(
        f"/v1/flows/{flow_id}/runs", json={"mode": "replay", "source_run_id": source}
    )
    served = await fs(client, r.json()["run_id"], op="read", path="a.txt")
    assert served["output"] == recorded["output"] and served["replay_outcome"] == "identical"
    assert not (tree["root"] / "a.txt").exists()
