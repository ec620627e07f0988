"""Fixtures of the browser tests: a real server with a slow sim engine, and Chromium.

Chromium is Debian's (``/usr/bin/chromium``; Playwright's own download is not used). Where it
or Playwright is missing the tests are skipped, naming it; under ``CI=true`` that fails them.
Screenshots go to ``$TEST_ARTIFACTS/ui`` (default ``test-artifacts/ui`` at the repo's root).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from orchestrator_client import AsyncClient
from orchestratord.api.app import create_app
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from test_harness.servers import serve_app
from tests.conftest import make_settings

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
# slow enough that tokens are seen arriving one by one
TOKENS_PER_S = 20.0


def _missing() -> str | None:
    try:
        import playwright.async_api  # noqa: F401
    except ImportError as exc:
        return f"Playwright is not installed ({exc}): pip install -e '.[dev]'"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: apt-get install chromium"
    return None


@pytest.fixture(scope="session")
def chromium() -> Path:
    missing = _missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}; CI=true requires it")
        pytest.skip(missing)
    return CHROMIUM


@pytest.fixture
def db_url(sqlite_template: Path, tmp_path: Path) -> str:
    """SQLite only: the pages read the API, whose backends are tested elsewhere."""
    target = tmp_path / "orch.db"
    shutil.copyfile(sqlite_template, target)
    return f"sqlite:///{target}"


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url, sim={"tokens_per_s": TOKENS_PER_S})


@pytest.fixture
async def server(orch: Orchestrator) -> AsyncIterator[str]:
    """The app on a loopback port (in this event loop); its base URL."""
    async with serve_app(create_app(orchestrator=orch)) as url:
        yield url


@pytest.fixture
async def api(server: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server, timeout=30) as client:
        yield client


@pytest.fixture
async def sdk(server: str) -> AsyncIterator[AsyncClient]:
    """The Python SDK's client of the server: how the tests start what the page shows."""
    async with AsyncClient(server) as client:
        yield client


@pytest.fixture
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=str(chromium), args=ARGS, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def page(browser: Browser, server: str) -> AsyncIterator[Page]:
    """A page whose uncaught script errors fail the test; closed before the server stops
    (which waits for the streams the page has open)."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        await context.close()
    assert errors == [], errors


@pytest.fixture(scope="session")
def artifacts() -> Path:
    root = os.environ.get("TEST_ARTIFACTS")
    folder = Path(root) / "ui" if root else ROOT / "test-artifacts" / "ui"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def screenshot(page: Page, artifacts: Path, name: str, *, full_page: bool = True) -> Path:
    path = artifacts / f"{re.sub(r'[^a-z0-9-]+', '-', name.lower())}.png"
    await page.screenshot(path=str(path), full_page=full_page)
    return path
