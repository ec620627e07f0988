"""No ``asyncio.wait_for`` in the service, its adapters, its SDK or its reference runtimes.

On Python 3.11 ``wait_for`` can swallow the waiting task's cancellation when what it waits
for completes at the same moment (CPython gh-86296): a cancelled step's read went on and the
cancel never reached the engine. ``async with asyncio.timeout(...)`` does not; it is used
everywhere instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "orchestratord",
    "worker_adapters",
    "orchestrator_core",
    "orchestrator_client",
    "test_harness",
    "contracts",
)


def _calls(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "wait_for" and getattr(node.func.value, "id", "") == "asyncio":
            lines.append(node.lineno)
    return lines


def test_nothing_waits_with_asyncio_wait_for() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for line in _calls(path)
    }
    assert not found, f"asyncio.wait_for (use asyncio.timeout): {sorted(found)}"
