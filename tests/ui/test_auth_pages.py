"""With auth on: the pages load without a key, ask for one, and read the API with it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from orchestrator_client import AsyncClient
from orchestrator_core.keys import Scope
from orchestratord.auth import store
from orchestratord.runtime import Orchestrator
from orchestratord.settings import Settings
from tests.conftest import make_settings
from tests.ui import calls
from tests.ui.conftest import screenshot

if TYPE_CHECKING:
    from playwright.async_api import Page


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url, auth={"cache_s": 0, "max_failures_per_minute": 0})


async def _key(orch: Orchestrator, scope: Scope) -> str:
    async with orch.db.write() as session:
        return await store.create(session, scope=scope, name=f"ui {scope.label}")


async def test_the_page_asks_for_a_key_and_shows_runs_with_a_read_key(
    page: Page, server: str, orch: Orchestrator, artifacts: Path
) -> None:
    writer, reader = await _key(orch, Scope.WRITE), await _key(orch, Scope.READ)
    async with AsyncClient(server, api_key=writer) as sdk:
        run_id = await calls.new_run(sdk)
    async with httpx.AsyncClient(base_url=server, timeout=30) as anonymous:
        assert (await anonymous.get("/v1/runs")).status_code == 401
        assert (await anonymous.get("/ui")).status_code == 200
    await page.goto(f"{server}/ui")
    form = page.locator("#key-form")
    await form.wait_for()
    await screenshot(page, artifacts, "key-form")
    assert await page.locator("#runs").count() == 0
    await page.fill("#key-input", "ok_wrong_key")
    await page.click("#key-form button[type=submit]")
    await page.wait_for_selector("#key-message:has-text('refused')")
    await page.fill("#key-input", reader)
    await page.click("#key-form button[type=submit]")
    await page.wait_for_selector(f'#runs tr[data-run-id="{run_id}"]')
    assert await form.is_hidden()
    # kept for the tab: the run page reads the run and follows its stream with it
    await page.click(f'#runs tr[data-run-id="{run_id}"] a >> nth=0')
    await page.wait_for_selector('body[data-page="run"] #live[data-state="live"]')
    assert await page.evaluate("sessionStorage.getItem('orchestratord.key')") == reader
    # the API explorer of the same tab reads the document, and tries routes, with that key
    await page.goto(f"{server}/docs")
    await page.wait_for_selector('.opblock-summary-path[data-path="/v1/runs/{run_id}"]')
    await page.go_back()
    await page.wait_for_selector('body[data-page="run"] #live[data-state="live"]')
    await page.click("#forget-key")
    await form.wait_for()
