"""The guard and the broker in-process: the setting's forms, the kernel's file systems read
from a mountinfo, protected names and inodes, hard links, and quotas under 40 threads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator_core.fs import FsPolicyViolation, FsRules
from orchestratord.fs import broker
from orchestratord.fs.guard import FsGuard, guard_for, kernel_devices, make_data_roots
from orchestratord.settings import BadSetting, Settings, load_settings

VAR = "ORCHESTRATORD_FS__ALLOWED_ROOTS"


@pytest.mark.parametrize(
    ("value", "roots"),
    [
        ("/srv/a,/srv/b", ["/srv/a", "/srv/b"]),
        (" /srv/a , /srv/b/ ", ["/srv/a", "/srv/b"]),
        ('["/srv/a", "/srv/b"]', ["/srv/a", "/srv/b"]),
        ("/", ["/"]),
        ("", []),
    ],
)
def test_allowed_roots_read_comma_separated_json_and_empty(
    monkeypatch: pytest.MonkeyPatch, value: str, roots: list[str]
) -> None:
    monkeypatch.setenv(VAR, value)
    assert load_settings().fs.allowed_roots == roots


def test_allowed_roots_default_to_files_in_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setenv("ORCHESTRATORD_DATA_DIR", str(tmp_path / "data"))
    settings = load_settings()
    assert settings.fs.allowed_roots == [str(tmp_path / "data" / "files")]
    make_data_roots(settings)
    assert (tmp_path / "data" / "files").is_dir()


def test_a_relative_allowed_root_is_taken_from_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(VAR, "files")
    assert load_settings().fs.allowed_roots == [str(tmp_path / "files")]


@pytest.mark.parametrize("value", ["/proc/self", "/srv,/sys", '["/dev/shm"]', '["/srv"'])
def test_an_allowed_root_in_a_protected_place_stops_the_server(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(VAR, value)
    with pytest.raises(BadSetting) as caught:
        load_settings()
    (line,) = caught.value.lines
    assert line.startswith(VAR), line


MOUNTINFO = """\
22 1 0:21 / /proc rw,nosuid - proc proc rw
23 1 0:22 / /sys rw,nosuid - sysfs sysfs rw
24 1 0:6 / /dev rw,nosuid - devtmpfs devtmpfs rw
25 24 0:23 / /dev/shm rw,nosuid - tmpfs shm rw
26 1 254:0 / / rw,relatime - ext4 /dev/vda rw
27 1 0:40 / /tmp rw - tmpfs tmpfs rw
28 24 254:0 /var/log/term /dev/termination-log rw - ext4 /dev/vda rw
29 1 0:41 / /srv/my\\040proc rw shared:7 - proc proc rw
30 23 0:42 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
"""


def test_kernel_devices_are_read_from_mountinfo(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    found = kernel_devices(str(info))
    kernel = {os.makedev(0, n) for n in (21, 22, 6, 23, 41, 42)}
    assert found == kernel  # not the disk (bound into /dev as one file), not /tmp's tmpfs


@pytest.fixture
def tree(tmp_path: Path) -> tuple[FsGuard, FsRules, Path]:
    root = tmp_path / "allowed" / "root"
    root.mkdir(parents=True)
    db = tmp_path / "allowed" / "root" / "orch.db"
    db.write_text("database")
    guard = FsGuard([str(tmp_path / "allowed")], [str(db)])
    return guard, FsRules.from_policy({"roots": [str(root)]}), root


def _reason(guard: FsGuard, rules: FsRules, op: str, path: str) -> str:
    with pytest.raises(FsPolicyViolation) as caught:
        broker.run_op(guard, rules, op, path, "x")
    return caught.value.reason


@pytest.mark.parametrize(
    ("op", "path"),
    [
        ("read", "orch.db"),
        ("write", "orch.db"),
        ("delete", "orch.db"),
        ("stat", "orch.db"),
        ("write", "orch.db-wal"),
        ("write", "orch.db-journal"),
        ("write", "orch.db-shm/inner"),
    ],
)
def test_the_server_s_database_names_are_protected(
    tree: tuple[FsGuard, FsRules, Path], op: str, path: str
) -> None:
    guard, rules, root = tree
    assert _reason(guard, rules, op, path) == "protected"
    assert (root / "orch.db").read_text() == "database"
    assert sorted(p.name for p in root.iterdir()) == ["orch.db"]


def test_a_hard_link_to_the_database_is_refused_by_inode(
    tree: tuple[FsGuard, FsRules, Path],
) -> None:
    guard, rules, root = tree
    (root / "sub").mkdir()
    os.link(root / "orch.db", root / "sub" / "copy")
    assert _reason(guard, rules, "read", "sub/copy") == "protected"


@pytest.mark.parametrize("op", ["read", "write", "delete", "stat"])
def test_a_hard_link_is_refused(tree: tuple[FsGuard, FsRules, Path], op: str) -> None:
    guard, rules, root = tree
    outside = root.parent.parent / "outside.txt"
    outside.write_text("outside")
    os.link(outside, root / "link.txt")
    assert _reason(guard, rules, op, "link.txt") == "hardlink"
    assert outside.read_text() == "outside" and (root / "link.txt").exists()


def test_a_root_out_of_bounds_is_refused_at_each_operation(
    tree: tuple[FsGuard, FsRules, Path],
) -> None:
    guard, _, root = tree
    elsewhere = FsRules.from_policy({"roots": [str(root.parent.parent)]})
    assert _reason(guard, elsewhere, "read", "x") == "root_not_allowed"
    proc = FsRules.from_policy({"roots": ["/proc/self"]})
    assert _reason(guard, proc, "read", "environ") == "protected"


def test_a_root_swapped_for_a_link_is_not_followed(tree: tuple[FsGuard, FsRules, Path]) -> None:
    guard, rules, root = tree
    (root / "a.txt").write_text("inside")
    moved = root.with_name("moved")
    root.rename(moved)
    root.symlink_to("/etc", target_is_directory=True)
    assert _reason(guard, rules, "read", "passwd") == "root_not_allowed"


def _at_once(guard: FsGuard, rules: FsRules, contents: list[str]) -> list[str]:
    """Each write from a thread of its own, released together: what each ended with."""
    start = threading.Barrier(len(contents))
    ends: list[str] = [""] * len(contents)

    def write(n: int) -> None:
        start.wait()
        try:
            broker.run_op(guard, rules, "write", f"f{n}.txt", contents[n])
            ends[n] = "ok"
        except FsPolicyViolation as exc:
            ends[n] = exc.reason

    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(contents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ends


def test_quotas_hold_under_40_threads(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    guard = FsGuard([str(tmp_path)])
    by_bytes = FsRules.from_policy({"roots": [str(root)], "quota_bytes": 100_000})
    ends = _at_once(guard, by_bytes, ["x" * 10_000] * 40)
    assert ends.count("ok") == 10 and set(ends) == {"ok", "quota"}
    assert sum(p.stat().st_size for p in root.iterdir()) == 100_000

    other = tmp_path / "other"
    other.mkdir()
    by_files = FsRules.from_policy({"roots": [str(other)], "quota_files": 3})
    ends = _at_once(guard, by_files, ["x"] * 40)
    assert ends.count("ok") == 3
    assert len([p for p in other.iterdir() if not p.name.startswith(".~fs-")]) == 3


def test_the_server_s_database_and_pools_file_are_protected(tmp_path: Path) -> None:
    (tmp_path / "pools.yaml").write_text("api_key: secret")
    (tmp_path / "o.db").write_text("database")
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'o.db'}",
        pools_file=tmp_path / "pools.yaml",
        fs={"allowed_roots": [str(tmp_path)]},
    )
    guard = guard_for(settings)
    rules = FsRules.from_policy({"roots": [str(tmp_path)]})
    for name in ("pools.yaml", "o.db", "o.db-wal", "o.db.lock"):
        assert _reason(guard, rules, "read", name) == "protected", name


def test_a_listing_leaves_protected_places_out(tmp_path: Path) -> None:
    (tmp_path / "o.db").write_text("database")
    (tmp_path / "o.db-wal").write_text("wal")
    (tmp_path / "notes.txt").write_text("notes")
    guard = FsGuard(["/"], [str(tmp_path / "o.db")])
    here = broker.run_op(guard, FsRules.from_policy({"roots": [str(tmp_path)]}), "list", ".", None)
    assert [e["name"] for e in here["entries"]] == ["notes.txt"]
    top = broker.run_op(guard, FsRules.from_policy({"roots": ["/"]}), "list", ".", None)
    assert not {e["name"] for e in top["entries"]} & {"proc", "sys", "dev"}


WRITER = """
import sys, time
from orchestrator_core.fs import FsPolicyViolation, FsRules
from orchestratord.fs import broker
from orchestratord.fs.guard import FsGuard
base, root, me, at = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rules = FsRules.from_policy({"roots": [root], "quota_bytes": 100_000})
guard = FsGuard([base])
time.sleep(max(0.0, at - time.time()))
for n in range(20):
    try:
        broker.run_op(guard, rules, "write", f"{me}-{n}.txt", "x" * 10_000)
    except FsPolicyViolation:
        pass
"""


def test_a_quota_holds_across_processes_sharing_a_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    at = time.time() + 2  # both start writing together, once imported
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(root), me, str(at)],
            cwd=Path(__file__).resolve().parents[2],
        )
        for me in ("a", "b", "c", "d")
    ]
    assert [p.wait(60) for p in procs] == [0, 0, 0, 0]
    stored = [p for p in root.iterdir() if not p.name.startswith(".~fs-")]
    assert len(stored) == 10 and sum(p.stat().st_size for p in stored) == 100_000
