"""Imports point down only: contracts <- worker_adapters, orchestrator_core <- orchestratord."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "contracts": {"orchestratord", "orchestrator_core", "worker_adapters", "test_harness"},
    "orchestrator_core": {
        "orchestratord",
        "worker_adapters",
        "test_harness",
        "fastapi",
        "sqlalchemy",
        "starlette",
        "httpx",
    },
    "orchestrator_client": {
        "orchestratord",
        "orchestrator_core",
        "worker_adapters",
        "test_harness",
        "fastapi",
        "starlette",
        "sse_starlette",
        "sqlalchemy",
        "uvicorn",
        "alembic",
    },
    "worker_adapters": {
        "orchestratord",
        "orchestrator_core",
        "test_harness",
        "fastapi",
        "sqlalchemy",
    },
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_down(package: str) -> None:
    offenders = {}
    for path in (ROOT / package).rglob("*.py"):
        if package == "contracts" and path.name == "openapi.py":
            continue  # the export script asks the server for its document
        bad = _imports(path) & FORBIDDEN[package]
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_the_client_package_loads_no_server_module() -> None:
    """The client and orchctl run anywhere httpx does: none of the server comes with them."""
    import subprocess
    import sys

    probe = (
        "import sys, orchestrator_client.orchctl\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {SERVER!r})\n"
        "print(','.join(bad))"
    ).replace("{SERVER!r}", repr(sorted(SERVER_MODULES)))
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


SERVER_MODULES = {
    "orchestratord",
    "orchestrator_core",
    "worker_adapters",
    "test_harness",
    "fastapi",
    "starlette",
    "sse_starlette",
    "sqlalchemy",
    "uvicorn",
    "alembic",
}


def _status_writes(path: Path) -> list[int]:
    """Lines that assign a step's status: ``<x>.status = ...`` on a name that is a step, or
    ``update(Step).values(status=...)``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "status"
                    and isinstance(target.value, ast.Name)
                    and "step" in target.value.id.lower()
                ):
                    lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "values"
            and any(k.arg == "status" for k in node.keywords)
            and "Step" in ast.unparse(node.func.value)
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_transition_function_writes_a_step_status() -> None:
    writers = {
        str(path.relative_to(ROOT)): found
        for path in (ROOT / "orchestratord").rglob("*.py")
        if (found := _status_writes(path))
    }
    assert list(writers) == ["orchestratord/steps/transition.py"], writers
    assert len(writers["orchestratord/steps/transition.py"]) == 1
