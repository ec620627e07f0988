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


CLIENT_MODULES = ["orchestratord/client.py", "orchestratord/orchctl.py"]
CLIENT_MAY_IMPORT = {"orchestratord", "orchestratord.client", "contracts"}
CLIENT_MAY_NOT_IMPORT = {
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


def _full_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


@pytest.mark.parametrize("module", CLIENT_MODULES)
def test_client_imports_no_server_module(module: str) -> None:
    """The client and orchctl run anywhere httpx does: none of the server comes with them."""
    offenders = set()
    for name in _full_imports(ROOT / module):
        allowed = name in CLIENT_MAY_IMPORT or name.startswith("contracts.")
        if not allowed and (name.startswith(".") or name.split(".")[0] in CLIENT_MAY_NOT_IMPORT):
            offenders.add(name)
    assert offenders == set()
