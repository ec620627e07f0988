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
    names = set()
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
