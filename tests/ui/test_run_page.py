"""The run page in Chromium: tokens arrive live, a dropped stream resumes without a repeat."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator_client import AsyncClient
from tests.ui import calls
from tests.ui.conftest import screenshot
from tests.ui.cutting_proxy import cutting_proxy

if TYPE_CHECKING:
    from playwright.async_api import Page

TOKENS_WHILE_RUNNING = """([row, n]) => {
  const r = document.querySelector(row);
  return r !== null && r.dataset.status === "running" && r.querySelectorAll(".tok").length >= n;
}"""
TOKEN_COUNT = "([row, n]) => document.querySelectorAll(row + ' .tok').length >= n"


def row(step_id: str) -> str:
    return f'li.step[data-step-id="{step_id}"]'


async def shown_tokens(page: Page, step_id: str) -> tuple[list[int], str]:
    """(indexes, text) of the tokens the page shows for the step, in page order."""
    tokens = page.locator(f"{row(step_id)} .tok")
    indexes = [int(i or -1) for i in await tokens.evaluate_all("ts => ts.map(t => t.dataset.i)")]
    return indexes, "".join(await tokens.all_text_contents())


async def test_tokens_arrive_live_and_the_run_ends(
    page: Page, sdk: AsyncClient, server: str, artifacts: Path
) -> None:
    run_id = await calls.new_run(
        sdk, budgets={"max_tokens_out": 400, "max_tokens_in": 100, "max_cost_usd": 0.5}
    )
    await page.goto(f"{server}/ui/runs/{run_id}")
    await page.wait_for_selector('#live[data-state="live"]')
    # 60 tokens at 20 a second: three seconds in which the page shows them arriving
    step_id = await calls.start_step(sdk, run_id, n=60, prompt="Write a haiku about rivers.")
    # shown while the step still runs: they came over the stream, one by one
    await page.wait_for_function(TOKENS_WHILE_RUNNING, arg=[row(step_id), 3])
    await screenshot(page, artifacts, "run-page-streaming")
    record = await calls.finished(sdk, step_id)
    assert record["status"] == "succeeded"
    await page.wait_for_selector(f'{row(step_id)}[data-status="succeeded"]')
    await page.wait_for_function(TOKEN_COUNT, arg=[row(step_id), 60])
    indexes, text = await shown_tokens(page, step_id)
    assert indexes == list(range(60))
    assert text == record["output"]["text"]
    # a second step, a fact (whose data is markup, shown as text) and a checkpoint
    second = await calls.start_step(sdk, run_id, token="s2", prompt="And the sea.", n=16)
    await calls.finished(sdk, second)
    markup = "<img src=x onerror=document.body.dataset.injected=1>"
    await calls.add_fact(sdk, run_id, "note", {"html": markup})
    fact = page.locator("#facts tr", has_text="note")
    await fact.wait_for()
    assert markup in await fact.inner_text()
    assert await page.locator("#facts img").count() == 0
    await calls.checkpoint(sdk, run_id, {"turn": 2})
    await calls.complete(sdk, run_id)
    await page.wait_for_selector('body[data-status="succeeded"]')
    await page.wait_for_selector('#live[data-state="ended"]')
    await page.wait_for_selector("#checkpoints tr")
    await page.wait_for_selector(f'{row(second)}[data-status="succeeded"]')
    assert await page.get_attribute("body", "data-injected") is None
    gauge = page.locator('[data-budget="tokens out"] .figures')
    assert await gauge.inner_text() == "76 used · 0 reserved · 400 limit"
    await screenshot(page, artifacts, "run-page")


async def test_a_dropped_stream_resumes_without_a_repeated_token(
    page: Page, sdk: AsyncClient, server: str, artifacts: Path
) -> None:
    run_id = await calls.new_run(sdk)
    n = 120
    step_id = await calls.start_step(sdk, run_id, n=n)
    # the proxy passes on each resume's Last-Event-ID three events earlier: the server
    # sends again tokens the page has shown, which it must drop
    async with cutting_proxy(server, rewind=3) as proxy:
        await page.goto(f"{proxy.url}/ui/runs/{run_id}")
        await page.wait_for_function(TOKENS_WHILE_RUNNING, arg=[row(step_id), 10])
        assert proxy.cut() >= 1
        before, _ = await shown_tokens(page, step_id)
        await page.wait_for_function(
            "() => { const l = document.getElementById('live');"
            " return Number(l.dataset.reconnects) >= 1 && l.dataset.state === 'live'; }"
        )
        record: dict[str, Any] = await calls.finished(sdk, step_id)
        await page.wait_for_selector(f'{row(step_id)}[data-status="succeeded"]')
        await page.wait_for_function(TOKEN_COUNT, arg=[row(step_id), n])
        await screenshot(page, artifacts, "run-page-resumed")
        indexes, text = await shown_tokens(page, step_id)
        resumes = proxy.resumes()
    assert len(before) < n  # cut mid-stream
    assert indexes == list(range(n))
    assert text == record["output"]["text"]
    assert resumes, "\n".join(f"{r.line} {r.last_event_id}" for r in proxy.requests)
    assert f"/v1/runs/{run_id}/stream" in resumes[0].line
    # the id of the last event the page had read whole: at least one per token shown
    assert resumes[0].last_event_id is not None and resumes[0].last_event_id >= len(before)
    repeats = await page.get_attribute(row(step_id), "data-repeats")
    assert repeats is not None and int(repeats) >= 1
