"""Properties of the file-system path rules (orchestrator_core.fs) and the broker behind them
(orchestratord.fs.broker): whatever path a step names, it is refused with a documented reason
or it lands beneath a root, and nothing outside the root is read or changed."""

from __future__ import annotations

import os
import posixpath
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from orchestrator_core.fs import FsPolicyViolation, FsRules, FsTarget
from orchestratord.fs import broker
from orchestratord.fs.guard import FsGuard

NAME_REASONS = {"outside_root", "invalid_path"}
BROKER_REASONS = NAME_REASONS | {"symlink", "not_regular"}
FAILURES = {
    "not_found",
    "is_a_directory",
    "not_a_directory",
    "not_text",
    "too_large",
    "root_unavailable",
}

ROOT_SETS = [
    ("/srv/data", "/srv/data/inner", "/srv/database"),  # nested, and one a prefix by name only
    ("/",),
    ("/srv/data/",),
]

hostile = st.sampled_from(
    [
        "..",
        ".",
        "",
        "...",
        "\x00",
        "a\x00b",
        "\u200b",  # zero-width space
        "\u202e",  # right-to-left override
        "\uff0e\uff0e",  # fullwidth dots
        "\u2024",  # one-dot leader
        "e\u0301",  # decomposed
        "a" * 256,
        "\\..",
        "~",
    ]
)
clean = st.text(alphabet="abcxyz019-_ .", min_size=1, max_size=6).filter(
    lambda s: s.strip(".") != ""
)
components = st.lists(hostile | clean | st.text(max_size=6), max_size=6)
separators = st.sampled_from(["/", "//", "/./"])


@st.composite
def paths(draw: st.DrawFn, roots: tuple[str, ...]) -> str:
    parts = draw(components)
    sep = draw(separators)
    body = sep.join(parts)
    lead = draw(
        st.sampled_from(["", "/", "/etc/", "/srv/", *roots]).flatmap(
            lambda r: st.just(r) | st.just(r + "/") | st.just(r + "kit/") if r else st.just(r)
        )
    )
    return lead + body


def _resolve(rules: FsRules, path: str) -> FsTarget | str:
    """The target, or the reason of the refusal."""
    try:
        return rules.resolve(path)
    except FsPolicyViolation as exc:
        refusal = exc
    assert refusal.code == "FS_POLICY_VIOLATION" and refusal.details["reason"] == refusal.reason
    return refusal.reason


def _under(root: str, target: FsTarget) -> bool:
    joined = posixpath.normpath(posixpath.join(root, *target.parts))
    return posixpath.commonpath([root, joined]) == root


@settings(max_examples=250, deadline=None)
@given(st.sampled_from(ROOT_SETS).flatmap(lambda roots: st.tuples(st.just(roots), paths(roots))))
def test_a_path_is_refused_with_its_reason_or_lies_beneath_a_root(
    case: tuple[tuple[str, ...], str],
) -> None:
    roots, path = case
    rules = FsRules.from_policy({"roots": list(roots)})
    target = _resolve(rules, path)
    if isinstance(target, str):
        assert target in NAME_REASONS
        return
    assert target.root in rules.roots
    assert all(p not in ("", ".", "..") and "/" not in p and "\x00" not in p for p in target.parts)
    assert _under(target.root, target)
    if path.startswith("/"):
        # the longest root the path names, on a component boundary
        named = [r for r in rules.roots if path == r or path.startswith(r.rstrip("/") + "/")]
        assert target.root == max(named, key=len)
        names = [p for p in path.split("/") if p not in ("", ".")]
        assert posixpath.join(target.root, *target.parts) == "/" + "/".join(names)
    else:
        assert target.root == rules.roots[0]


@settings(max_examples=200, deadline=None)
@given(components, separators)
def test_dot_dot_and_nul_are_always_refused(parts: list[str], sep: str) -> None:
    rules = FsRules.from_policy({"roots": ["/srv/data"]})
    path = sep.join(parts)
    names = [p for p in path.split("/") if p not in ("", ".")]
    target = _resolve(rules, path)
    if isinstance(target, str):
        assert target in NAME_REASONS
        return
    assert ".." not in names and "\x00" not in path
    assert list(target.parts) == names


@settings(max_examples=200, deadline=None)
@given(st.lists(clean, max_size=6), separators)
def test_plain_relative_names_are_taken_as_they_are(parts: list[str], sep: str) -> None:
    target = FsRules.from_policy({"roots": ["/srv/data"]}).resolve(sep.join(parts))
    assert target == FsTarget("/srv/data", tuple(parts))


def test_no_roots_refuses_every_path() -> None:
    with pytest.raises(FsPolicyViolation) as info:
        FsRules.from_policy({"roots": []}).resolve("a.txt")
    assert info.value.reason == "no_roots"


# --- the broker on a real tree with links out of the root ----------------------------------------

SECRET = "outside: do not touch\n"
NAMES = ["a.txt", "sub", "b.txt", "link_file", "link_dir", "up", "pipe", "new", "secret.txt"]


def _tree(base: Path) -> tuple[Path, Path]:
    root, outside = base / "root", base / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.txt").write_text("beta\n")
    (root / "link_file").symlink_to(outside / "secret.txt")
    (root / "link_dir").symlink_to(outside, target_is_directory=True)
    (root / "sub" / "up").symlink_to("..", target_is_directory=True)  # a link within the root
    os.mkfifo(root / "pipe")
    return root, outside


def _snapshot(outside: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in outside.iterdir()}


@st.composite
def broker_paths(draw: st.DrawFn) -> tuple[str, list[str]]:
    """(where the path starts, its components): relative, under the root, or outside it."""
    lead = draw(st.sampled_from(["", "", "", "root", "root", "outside", "rootkit"]))
    names = st.sampled_from(NAMES)  # mostly names in the tree, so that many operations run
    parts = draw(
        st.lists(names | names | names | st.sampled_from(["..", ".", ""]) | hostile, max_size=4)
    )
    return lead, parts


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(broker.OPS)), broker_paths(), st.sampled_from(["//", "/"]))
def test_the_broker_never_reaches_outside_its_root(
    op: str, where: tuple[str, list[str]], sep: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = _tree(Path(tmp))
        before = _snapshot(outside)
        lead, parts = where
        prefix = {"": "", "root": f"{root}/", "outside": f"{outside}/", "rootkit": f"{root}kit/"}
        path = prefix[lead] + sep.join(parts)
        rules = FsRules.from_policy({"roots": [str(root)]})
        result: dict[str, Any] | None = None
        refused = failed = None
        try:
            result = broker.run_op(FsGuard([tmp]), rules, op, path, "written\n")
        except FsPolicyViolation as exc:
            refused = exc.reason
        except broker.FsFailure as exc:
            failed = exc.reason
        event(f"{op}: {refused or failed or 'done'}")
        assert refused is None or refused in BROKER_REASONS
        assert failed is None or failed in FAILURES
        assert _snapshot(outside) == before
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["outside", "root"]
        if result is None:
            return
        target = rules.resolve(path)
        real_root = os.path.realpath(root)
        reached = Path(real_root, *target.parts)
        # no link on the way: the name and its real path agree, beneath the root
        assert os.path.realpath(reached) == str(reached)
        assert os.path.commonpath([real_root, reached]) == real_root
        if op == "read":
            assert result["content"] != SECRET
        if op == "write":
            assert reached.is_file() and not reached.is_symlink()
            assert reached.read_text() == "written\n"
