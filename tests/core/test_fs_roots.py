"""The rule on a run's fs_policy roots alone (orchestrator_core.fs_roots): beneath an allowed
root, never in a protected place, each refusal naming ``fs_policy.roots[i]``."""

from __future__ import annotations

import pytest

from orchestrator_core.errors import InvalidParams
from orchestrator_core.fs_roots import RootBounds, beneath

BOUNDS = RootBounds(allowed=("/srv/data", "/home/app/files"), protected=("/proc", "/sys", "/dev"))
EVERYWHERE = RootBounds(allowed=("/",), protected=("/proc", "/sys", "/dev", "/var/lib/o/o.db"))


@pytest.mark.parametrize(
    ("path", "base", "inside"),
    [
        ("/srv/data", "/srv/data", True),
        ("/srv/data/a", "/srv/data", True),
        ("/srv/database", "/srv/data", False),  # a prefix by name only
        ("/srv", "/srv/data", False),
        ("/anything", "/", True),
        ("/", "/", True),
    ],
)
def test_beneath(path: str, base: str, inside: bool) -> None:
    assert beneath(path, base) is inside


@pytest.mark.parametrize(
    ("bounds", "resolved", "reason"),
    [
        (BOUNDS, "/srv/data", None),
        (BOUNDS, "/srv/data/run-1", None),
        (BOUNDS, "/home/app/files/x", None),
        (BOUNDS, "/srv/database", "root_not_allowed"),
        (BOUNDS, "/", "root_not_allowed"),
        (BOUNDS, "/etc", "root_not_allowed"),
        (BOUNDS, "/proc/self", "protected"),
        (EVERYWHERE, "/etc", None),
        (EVERYWHERE, "/", None),  # allowed: the broker refuses what lies below that is protected
        (EVERYWHERE, "/proc", "protected"),
        (EVERYWHERE, "/proc/1/root", "protected"),
        (EVERYWHERE, "/sys/kernel", "protected"),
        (EVERYWHERE, "/dev/shm", "protected"),
        (EVERYWHERE, "/devices", None),  # not /dev
        (EVERYWHERE, "/var/lib/o/o.db", "protected"),
        (RootBounds(allowed=()), "/srv/data", "root_not_allowed"),  # none allowed: no files
    ],
)
def test_root_refusal(bounds: RootBounds, resolved: str, reason: str | None) -> None:
    why = bounds.refusal(resolved)
    assert (why[0] if why else None) == reason


def test_check_names_the_root_and_resolves_each_first() -> None:
    links = {"/srv/data/link": "/proc/self", "/srv/data/ok": "/srv/data/real"}
    BOUNDS.check(["/srv/data/ok", "/srv/data/x"], lambda p: links.get(p, p))
    with pytest.raises(InvalidParams) as caught:
        BOUNDS.check(["/srv/data/ok", "/srv/data/link"], lambda p: links.get(p, p))
    assert caught.value.field == "fs_policy.roots[1]"
    assert caught.value.details["reason"] == "protected"


def test_a_relative_root_is_refused() -> None:
    with pytest.raises(InvalidParams) as caught:
        BOUNDS.check(["data"], lambda p: p)
    assert caught.value.field == "fs_policy.roots[0]"
